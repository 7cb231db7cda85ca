"""Retrieval service figures: throughput against FlashRAG in process, batching, latency, recall.

    .venv/bin/python bench/retrieval.py [--world-entities 200000] [--work runs/bench_retrieval]

On the shared HotpotQA sample (when ../shared/data is present) and a synthetic world, it builds
BM25 and MiniLM indexes (cached in --work; the 200k-passage MiniLM encode takes about half an
hour on 2 cores, once), starts the real services (cache off, so every query is computed), and
prints one table per dataset, with rows for `r3rag retriever serve --ray` at 1 and 2 Ray Serve
replicas (each a local Ray cluster of its own). All figures of a table come from one run; compare
them as ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import SHARED_DATA, ServiceProcess, minilm_path  # noqa: E402

from r3_env.data import read_dataset  # noqa: E402
from r3_env.retrieval import RetrieverConfig, load_retriever  # noqa: E402
from r3_env.retrieval.index_builder import IndexBuildConfig, build_index  # noqa: E402
from r3_env.world import WorldConfig, generate_world  # noqa: E402

BATCH = 64


def build(corpus: Path, work: Path) -> dict[str, RetrieverConfig]:
    bm25_dir = work / "bm25"
    if not (bm25_dir / "params.index.json").exists():
        build_index(IndexBuildConfig(corpus_path=str(corpus), save_dir=str(work)))
    dense = build_index(
        IndexBuildConfig(
            retrieval_method="minilm",
            corpus_path=str(corpus),
            save_dir=str(work),
            model_path=minilm_path(),
            sentence_transformer=True,
            batch_size=128,
        )
    )
    common = {"corpus_path": str(corpus), "retrieval_model_path": minilm_path(), "use_sentence_transformer": True}
    return {
        "bm25": RetrieverConfig(index_path=str(bm25_dir)),
        "minilm": RetrieverConfig(retrieval_method="minilm", index_path=str(dense), **common),
        "hybrid": RetrieverConfig(
            retrieval_method="hybrid",
            dense_method="minilm",
            index_path=str(dense),
            bm25_index_path=str(bm25_dir),
            **common,
        ),
    }


def recall(configs: dict[str, RetrieverConfig], items) -> dict[str, dict[str, float]]:
    """Mean share of gold passages in the top 5, and the share of questions with all of them there."""
    out = {}
    questions = [item.question for item in items]
    for name, config in configs.items():
        with load_retriever(config) as retriever:
            hits = retriever.search(questions, 5)
        shares, full = [], 0
        for item, row in zip(items, hits, strict=True):
            gold = set(item.metadata["supporting_passage_ids"])
            got = gold & {h.passage.id for h in row}
            shares.append(len(got) / len(gold))
            full += got == gold
        out[name] = {"recall@5": statistics.mean(shares), "all_gold@5": full / len(items)}
    return out


def flashrag_bm25_qps(config: RetrieverConfig, queries: list[str]) -> tuple[float, list[list[str]]]:
    from flashrag.retriever.retriever import BM25Retriever

    retriever = BM25Retriever(
        {
            "retrieval_method": "bm25",
            "retrieval_topk": 5,
            "index_path": config.index_path,
            "corpus_path": "",
            "save_retrieval_cache": False,
            "use_retrieval_cache": False,
            "retrieval_cache_path": None,
            "use_reranker": False,
            "bm25_backend": "bm25s",
        }
    )
    retriever.batch_search(queries[:BATCH], num=5)  # numba compiles here
    ranked: list[list[str]] = []
    started = time.perf_counter()
    for start in range(0, len(queries), BATCH):
        ranked += [[d["id"] for d in row] for row in retriever.batch_search(queries[start : start + BATCH], num=5)]
    return len(queries) / (time.perf_counter() - started), ranked


def in_process_qps(config: RetrieverConfig, queries: list[str]) -> tuple[float, list[list[str]]]:
    with load_retriever(config) as retriever:
        retriever.search(queries[:BATCH], 5)
        ranked: list[list[str]] = []
        started = time.perf_counter()
        for start in range(0, len(queries), BATCH):
            ranked += [[h.passage.id for h in row] for row in retriever.search(queries[start : start + BATCH], 5)]
        return len(queries) / (time.perf_counter() - started), ranked


async def concurrent(
    url: str, queries: list[str], path: str, body, clients: int = 32, per_request: int = 1
) -> tuple[float, list[float]]:
    """Load from ``clients`` concurrent clients (aiohttp: a Python client that itself keeps up)."""
    latencies: list[float] = []
    queue = [queries[i : i + per_request] for i in range(0, len(queries), per_request)]

    async def worker(session: aiohttp.ClientSession) -> None:
        while queue:
            query = queue.pop()
            begin = time.perf_counter()
            async with session.post(url + path, json=body(query)) as response:
                await response.read()
                response.raise_for_status()
            latencies.append(time.perf_counter() - begin)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(clients)))
        return len(queries) / (time.perf_counter() - started), latencies


def load_figures(url: str, queries: list[str]) -> dict[str, float]:
    """Throughput under concurrent load: 4 clients of 64-query batches, 32 clients of single queries."""
    figures: dict[str, float] = {}
    figures["retrieve_batch64_4_clients_qps"], _ = asyncio.run(
        concurrent(url, queries, "/retrieve", lambda q: {"queries": q, "topk": 5}, clients=4, per_request=BATCH)
    )
    qps, latencies = asyncio.run(concurrent(url, queries, "/retrieve", lambda q: {"queries": q, "topk": 5}))
    latencies.sort()
    figures["retrieve_32_clients_qps"] = qps
    figures["p50_ms"] = 1000 * latencies[len(latencies) // 2]
    figures["p99_ms"] = 1000 * latencies[int(len(latencies) * 0.99)]
    return figures


def service_figures(url: str, queries: list[str], single_limit: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    with httpx.Client(timeout=120) as http:
        http.post(url + "/retrieve", json={"queries": queries[:BATCH], "topk": 5})  # warm up
        started = time.perf_counter()
        for start in range(0, len(queries), BATCH):
            http.post(url + "/retrieve", json={"queries": queries[start : start + BATCH], "topk": 5}).raise_for_status()
        figures["retrieve_batch64_qps"] = len(queries) / (time.perf_counter() - started)
        singles = queries[:single_limit]
        started = time.perf_counter()
        for query in singles:
            http.post(url + "/search", json={"query": query}).raise_for_status()
        figures["search_single_qps"] = len(singles) / (time.perf_counter() - started)

    figures.update(load_figures(url, queries))
    return figures


def serve(config: RetrieverConfig, work: Path, name: str, replicas: int = 0) -> ServiceProcess:
    """The service as a process; with ``replicas``, on Ray Serve (a local Ray cluster of its own)."""
    import yaml

    values = {k: v for k, v in config.__dict__.items() if v not in ("", None)}
    values["service"] = {"cache_size": 0, "max_queries_per_request": 4096}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values))
    ray = ["--ray", "--ray.replicas", str(replicas), "--ray.replica_num_cpus", "0.5"] if replicas else []
    return ServiceProcess(["retriever", "serve", "--config", str(path), *ray], timeout=600)


def serve_figures(config: RetrieverConfig, work: Path, name: str, queries: list[str], replicas: list[int]) -> dict:
    """Throughput of ``r3rag retriever serve --ray`` with each number of replicas."""
    figures = {}
    for count in replicas:
        with serve(config, work, f"{name}-serve{count}", replicas=count) as service:
            load_figures(service.url, queries[:BATCH])  # warm up every replica
            figures[count] = load_figures(service.url, queries)
    return figures


def bench(label: str, corpus: Path, items, work: Path, single_limit: int, replicas: list[int]) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    configs = build(corpus, work)
    queries = [item.question for item in items]
    result: dict = {"dataset": label, "queries": len(queries), "quality": recall(configs, items)}
    fr_qps, fr_ranked = flashrag_bm25_qps(configs["bm25"], queries)
    ours_qps, ours_ranked = in_process_qps(configs["bm25"], queries)
    result["bm25_equals_flashrag"] = fr_ranked == ours_ranked
    result["bm25"] = {"flashrag_in_process_qps": fr_qps, "r3rag_in_process_qps": ours_qps}
    with serve(configs["bm25"], work, "bm25") as service:
        result["bm25"].update(service_figures(service.url, queries, single_limit))
    result["bm25"]["serve"] = serve_figures(configs["bm25"], work, "bm25", queries, replicas)
    dense_qps, _ = in_process_qps(configs["minilm"], queries)
    result["minilm"] = {"r3rag_in_process_qps": dense_qps}
    with serve(configs["minilm"], work, "minilm") as service:
        result["minilm"].update(service_figures(service.url, queries, single_limit))
    result["minilm"]["serve"] = serve_figures(configs["minilm"], work, "minilm", queries, replicas)
    return result


def show(result: dict) -> None:
    print(f"\n== {result['dataset']}: {result['queries']} queries, top-5 ==")
    print(f"{'retriever':<8} {'recall@5':>9} {'all gold@5':>11}")
    for name, q in result["quality"].items():
        print(f"{name:<8} {q['recall@5']:>9.3f} {q['all_gold@5']:>11.3f}")
    print(f"BM25 rankings identical to FlashRAG's BM25Retriever: {result['bm25_equals_flashrag']}")
    for name in ("bm25", "minilm"):
        f = result[name]
        line = f"{name}: in-process {f['r3rag_in_process_qps']:.0f} q/s"
        if "flashrag_in_process_qps" in f:
            ratio = f["retrieve_batch64_qps"] / f["flashrag_in_process_qps"]
            line += (
                f", FlashRAG in-process {f['flashrag_in_process_qps']:.0f} q/s; /retrieve batch 64 "
                f"{f['retrieve_batch64_qps']:.0f} q/s = {ratio:.2f}x FlashRAG"
            )
        else:
            line += f"; /retrieve batch 64 {f['retrieve_batch64_qps']:.0f} q/s"
        print(line)
        four = f["retrieve_batch64_4_clients_qps"]
        versus = f" = {four / f['flashrag_in_process_qps']:.2f}x FlashRAG" if "flashrag_in_process_qps" in f else ""
        print(f"   /retrieve batch 64 from 4 clients at once {four:.0f} q/s{versus}")
        print(
            f"   /search one query per call {f['search_single_qps']:.1f} q/s: batched is "
            f"{f['retrieve_batch64_qps'] / f['search_single_qps']:.1f}x; 32 concurrent one-query /retrieve "
            f"clients {f['retrieve_32_clients_qps']:.0f} q/s, p50 {f['p50_ms']:.1f} ms, p99 {f['p99_ms']:.1f} ms"
        )
        for count, serve in f["serve"].items():
            print(
                f"   Ray Serve, {count} replica{'s' if count > 1 else ''}: batch 64 from 4 clients "
                f"{serve['retrieve_batch64_4_clients_qps']:.0f} q/s "
                f"({serve['retrieve_batch64_4_clients_qps'] / four:.2f}x the plain service); 32 one-query clients "
                f"{serve['retrieve_32_clients_qps']:.0f} q/s "
                f"({serve['retrieve_32_clients_qps'] / f['retrieve_32_clients_qps']:.2f}x), p50 "
                f"{serve['p50_ms']:.1f} ms, p99 {serve['p99_ms']:.1f} ms"
            )


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-entities", type=int, default=200_000)
    parser.add_argument("--world-questions", type=int, default=2000)
    parser.add_argument("--single-limit", type=int, default=400, help="queries sent one per /search call")
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench_retrieval"))
    parser.add_argument("--serve-replicas", default="1,2", help="Ray Serve replica counts to measure (empty: none)")
    args = parser.parse_args()
    replicas = [int(count) for count in args.serve_replicas.split(",") if count]
    work = Path(args.work)
    results = []
    hotpot = SHARED_DATA / "hotpotqa"
    if (hotpot / "dev.jsonl").exists():
        results.append(
            bench(
                "HotpotQA (shared sample)",
                hotpot / "corpus.jsonl",
                read_dataset(hotpot / "dev.jsonl"),
                work / "hotpotqa",
                args.single_limit,
                replicas,
            )
        )
    else:
        print(f"skipping HotpotQA: {hotpot} is absent")
    world_dir = work / f"world{args.world_entities}"
    generate_world(
        WorldConfig(entities=args.world_entities, seed=0, dev_questions=args.world_questions, bm25_check=0), world_dir
    )
    results.append(
        bench(
            f"synthetic world, {args.world_entities:,} passages",
            world_dir / "corpus.jsonl",
            read_dataset(world_dir / "dev.jsonl"),
            work / f"world{args.world_entities}-idx",
            args.single_limit,
            replicas,
        )
    )
    for result in results:
        show(result)
    (work / "results.json").write_text(json.dumps(results, indent=2))
    print(f"\nwritten to {work / 'results.json'}")


if __name__ == "__main__":
    main()
