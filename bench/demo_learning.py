"""Does the demo learn? Dev EM and mean episode reward of the untrained, SFT and PPO policies, over seeds.

    python bench/demo_learning.py [--seeds 0,1,2] [--model tiny-random] [--quick] [--out bench_out/demo_learning]

Runs ``r3rag demo`` once per seed into OUT/seedS (a rerun resumes), then scores each policy's
greedy episodes on the same dev questions through the agent, with the training reward (the r3
scheme, the lexical judge behind the reward server), and prints mean and spread over seeds. EM
comes from the demo's own evaluation runs. Results go to OUT/demo_learning.json too.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from demo.run import ENV, Demo, DemoConfig  # noqa: E402

POLICIES = ("untrained", "sft", "ppo")


def policy_rewards(demo: Demo) -> dict[str, dict[str, float]]:
    """Greedy dev episodes of each policy, scored as in training (services started again for it)."""
    from r3_env.data import read_dataset
    from r3_env.rollout import RolloutConfig
    from r3_env.train.ppo import evaluate_rewards

    items = read_dataset(demo.paths["world"] / "dev.jsonl")[: demo.budget.eval_questions]
    folders = {"untrained": demo.paths["policy0"], "sft": demo.paths["sft_policy"], "ppo": demo.paths["ppo_policy"]}
    with demo.serving() as (retriever_url, reward_url):
        urls = {"retriever_url": retriever_url, "reward_url": reward_url}
        rollout = RolloutConfig.from_dict({"env": ENV, "reward": {"scheme": "r3"}, "services": urls})
        return {name: evaluate_rewards(str(folder), items, rollout) for name, folder in folders.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--model", default="tiny-random", help="the demo's --model")
    parser.add_argument("--quick", action="store_true", help="the --quick demo budget")
    parser.add_argument("--out", default="bench_out/demo_learning")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    out = Path(args.out)
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        started = time.perf_counter()
        demo = Demo(DemoConfig(out=str(out / f"seed{seed}"), model=args.model, seed=seed, quick=args.quick))
        results = demo.run()
        rewards = policy_rewards(demo)
        for name in POLICIES:
            rows.append(
                {
                    "seed": seed,
                    "policy": name,
                    "em": results[name]["em"],
                    "f1": results[name]["f1"],
                    "answered": results[name]["answered"],
                    "reward": rewards[name]["reward"],
                    "format_error": rewards[name]["format_error"],
                    "correct": rewards[name]["correct"],
                }
            )
        print(f"seed {seed}: demo and reward evaluation in {time.perf_counter() - started:.0f} s", flush=True)
    (out / "demo_learning.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"\n{'policy':<11}{'dev EM %':>16}{'dev F1 %':>16}{'mean reward':>18}{'format errors %':>18}")
    for name in POLICIES:
        mine = [r for r in rows if r["policy"] == name]

        def spread(key: str, scale: float = 1.0, mine: list = mine) -> str:
            values = [scale * r[key] for r in mine]
            deviation = statistics.stdev(values) if len(values) > 1 else 0.0
            return f"{statistics.mean(values):.2f} ± {deviation:.2f}"

        print(
            f"{name:<11}{spread('em', 100):>16}{spread('f1', 100):>16}{spread('reward'):>18}"
            f"{spread('format_error', 100):>18}"
        )
    print(f"({len(rows) // len(POLICIES)} seeds; mean ± standard deviation over seeds)")


if __name__ == "__main__":
    main()
