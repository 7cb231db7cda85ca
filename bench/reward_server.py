"""Reward-server throughput and latency against a stand-in judge with a fixed latency.

    .venv/bin/python bench/reward_server.py [--latency 0.05] [--in-flight 16] [--items 3000]

The stand-in judge (tests/standin_judge.py) is a TEST DOUBLE for a 14B model behind vLLM: an
OpenAI-compatible server that answers every request after ``--latency`` seconds. With the
in-flight limit L and latency t, the ideal judged throughput is L / t items per second; the
figure to meet is at least 0.85 of it with 64 concurrent clients. Then the same load again with
every item already in the sqlite cache. All three processes share this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import ServiceProcess  # noqa: E402


def item(i: int, tag: str) -> dict:
    return {
        "question": f"Who directed film {tag} {i}?",
        "analysis": "I need the director.",
        "query": f"director of film {i}",
        "documents": [f"Film {i} was directed by Person {i}."],
    }


async def load(url: str, total: int, clients: int, per_request: int, tag: str) -> tuple[float, list[float], int]:
    """Send ``total`` items from ``clients`` concurrent clients; returns (items/s, latencies, failures)."""
    queue = list(range(0, total, per_request))
    latencies: list[float] = []
    failures = 0

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal failures
        while queue:
            start = queue.pop()
            body = {"items": [item(i, tag) for i in range(start, min(total, start + per_request))]}
            begin = time.perf_counter()
            async with session.post(url + "/relevance", json=body) as response:
                payload = await response.json() if response.status == 200 else {}
            latencies.append(time.perf_counter() - begin)
            rows = payload.get("results", [])
            failures += sum(r["fallback"] for r in rows) + (response.status != 200)

    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=clients), timeout=aiohttp.ClientTimeout(total=120)
    ) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        return total / (time.perf_counter() - started), sorted(latencies), failures


def percentile(values: list[float], q: float) -> float:
    return 1000 * values[min(len(values) - 1, int(len(values) * q))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.05, help="stand-in judge latency, seconds")
    parser.add_argument("--in-flight", type=int, default=16, help="the reward server's judge.max_in_flight")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--items", type=int, default=3000)
    args = parser.parse_args()
    ideal = args.in_flight / args.latency
    print(
        f"stand-in judge latency {1000 * args.latency:.0f} ms, in-flight limit {args.in_flight}: "
        f"ideal {ideal:.0f} judged items/s; {args.clients} concurrent clients, {args.items} items per run\n"
    )
    print(f"{'run':<34} {'items/s':>8} {'x ideal':>8} {'p50 ms':>8} {'p99 ms':>8} {'fallbacks':>9}")
    with (
        tempfile.TemporaryDirectory() as work,
        ServiceProcess(["--latency", str(args.latency)], script=str(ROOT / "tests" / "standin_judge.py")) as judge,
    ):
        config = Path(work) / "reward.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "judge": {
                        "backend": "openai",
                        "base_url": judge.url + "/v1",
                        "model": "standin",
                        "retries": 0,
                        "timeout_s": 30,
                        "max_in_flight": args.in_flight,
                        "cache_path": str(Path(work) / "cache.sqlite"),
                    },
                    "service": {"max_items": 10_000},
                }
            )
        )
        with ServiceProcess(["reward", "serve", "--config", str(config)]) as server:
            for label, per_request, tag in (
                ("1 item per request", 1, "a"),
                ("8 items per request", 8, "b"),
                ("cache hits, 1 item per request", 1, "a"),
            ):
                qps, latencies, failures = asyncio.run(load(server.url, args.items, args.clients, per_request, tag))
                ratio = f"{qps / ideal:.2f}" if not label.startswith("cache") else "-"
                print(
                    f"{label:<34} {qps:>8.0f} {ratio:>8} {percentile(latencies, 0.5):>8.1f} "
                    f"{percentile(latencies, 0.99):>8.1f} {failures:>9}"
                )


if __name__ == "__main__":
    main()
