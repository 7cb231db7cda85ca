"""PPO with rollouts from HF generate (in the trainer) against rollouts from a vLLM server, from one policy.

    python bench/rollout_engines.py --demo DEMO_OUT [--iterations 2] [--out DEMO_OUT/rollout_engines]

Takes a finished ``r3rag demo`` folder (its world, index, services and SFT policy) and runs PPO from
the SFT policy once per engine, with the demo's settings and seed, into OUT/hf and OUT/vllm (a
rerun resumes). Prints each iteration's time split (weight sync, generation, training) and the
ratio of the engines' means. The vLLM side needs ``bash scripts/setup_vllm.sh`` (vLLM's CPU build).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from demo.run import Demo  # noqa: E402

ENGINES = ("hf", "vllm")
COLUMNS = ("iteration_s", "sync_s", "generation_s", "training_s", "reward", "correct", "response_tokens")


def ppo_rows(folder: Path) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["stage"] == "ppo"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo", required=True, help="a finished demo's --out folder")
    parser.add_argument("--iterations", type=int, default=2, help="PPO iterations per engine")
    parser.add_argument("--vllm_python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--out", default="", help="default: DEMO/rollout_engines")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = Path(args.out or Path(args.demo) / "rollout_engines")
    try:
        demos = {engine: Demo.from_folder(args.demo, rollout_engine=engine, vllm_python=args.vllm_python)[0]
                 for engine in ENGINES}  # fmt: skip
        sft_policy = demos["hf"].finished_sft_policy()
    except ValueError as error:
        sys.exit(f"--demo: {error}")
    with demos["hf"].serving() as urls:
        for engine, engine_demo in demos.items():
            engine_demo.ppo_again({"ppo.iterations": args.iterations}, out / engine, urls)
    rows = {engine: ppo_rows(out / engine) for engine in ENGINES}
    print(f"\n{'engine':<8}{'iteration':>10}" + "".join(f"{c:>17}" for c in COLUMNS))
    for engine, engine_rows in rows.items():
        for row in engine_rows:
            cells = "".join(f"{row.get(c, 0.0):>17.2f}" for c in COLUMNS)
            print(f"{engine:<8}{row['step']:>10}{cells}")
    for column in ("generation_s", "iteration_s"):
        hf, vllm = (statistics.mean(r[column] for r in rows[e]) for e in ENGINES)
        print(f"mean {column}: hf {hf:.1f} s, vllm {vllm:.1f} s (hf / vllm = {hf / vllm:.2f})")
    print(f"(policy {sft_policy}; {args.iterations} iterations per engine; vLLM's sync_s included in iteration_s)")


if __name__ == "__main__":
    main()
