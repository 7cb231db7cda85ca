"""Synthetic-world generation: wall time, passages per second and peak memory by world size.

Each size runs in its own process so peak memory (ru_maxrss) is that size's alone.

    .venv/bin/python bench/world_generation.py [--sizes 1000 10000 100000] [--bm25-check 0]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

CHILD = """
import json, resource, sys, time
from r3_env.world import WorldConfig, generate_world
size, out, check = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
started = time.perf_counter()
stats = generate_world(WorldConfig(entities=size, seed=0, bm25_check=check), out)
seconds = time.perf_counter() - started
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": seconds, "peak_mb": peak_mb, "bm25": stats.get("bm25_top5", {}).get("all_gold_found")}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--bm25-check", type=int, default=0, help="questions for the BM25 check (0: skip it)")
    args = parser.parse_args()
    print(f"{'entities':>10} {'seconds':>8} {'passages/s':>11} {'peak MB':>8} {'BM25 all-gold':>14}")
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as out:
            result = subprocess.run(
                [sys.executable, "-c", CHILD, str(size), out, str(args.bm25_check)],
                capture_output=True,
                text=True,
                check=True,
            )
        row = json.loads(result.stdout.strip().splitlines()[-1])
        bm25 = "-" if row["bm25"] is None else f"{100 * row['bm25']:.1f}%"
        print(f"{size:>10,} {row['seconds']:>8.1f} {size / row['seconds']:>11,.0f} {row['peak_mb']:>8.0f} {bm25:>14}")


if __name__ == "__main__":
    main()
