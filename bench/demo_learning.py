"""Does the demo learn? Dev EM and mean episode reward of the untrained, SFT and PPO policies, over seeds.

    python bench/demo_learning.py [--seeds 0,1,2] [--model tiny-random] [--quick] [--hotpotqa 50]
        [--out bench_out/demo_learning]

Runs ``r3rag demo`` once per seed into OUT/seedS (a rerun resumes), then scores each policy's
greedy episodes on the same dev questions through the agent, with the training reward (the r3
scheme, the lexical judge behind the reward server), and prints mean and spread over seeds. EM
comes from the demo's own evaluation runs. With ``--hotpotqa N`` (and ../shared/data), each
policy also answers the first N questions of the shared HotpotQA sample over a BM25 index of its
paragraphs: what the world's training transfers to real questions. Each seed's rows are
kept in OUT/seedS/learning.json (a rerun with the same settings reads them back), all of them in
OUT/demo_learning.json.
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

from demo.run import Demo, DemoConfig  # noqa: E402
from demo.services import ServiceProcess  # noqa: E402
from demo.settings import ENV  # noqa: E402
from r3_env.real_data import SHARED_DATA  # noqa: E402

POLICIES = ("untrained", "sft", "ppo")


def policy_folders(demo: Demo) -> dict[str, Path]:
    return {"untrained": demo.paths["policy0"], "sft": demo.paths["sft_policy"], "ppo": demo.paths["ppo_policy"]}


def policy_rewards(demo: Demo, folders: dict[str, Path]) -> dict[str, dict[str, float]]:
    """Greedy dev episodes of each policy, scored as in training (services started again for it)."""
    from r3_env.data import read_dataset
    from r3_env.rollout_config import RolloutConfig
    from r3_env.train.ppo import evaluate_rewards

    items = read_dataset(demo.paths["world"] / "dev.jsonl")[: demo.budget.eval_questions]
    with demo.serving() as (retriever_url, reward_url):
        urls = {"retriever_url": retriever_url, "reward_url": reward_url}
        rollout = RolloutConfig.from_dict({"env": ENV, "reward": {"scheme": "r3"}, "services": urls})
        return {name: evaluate_rewards(str(folder), items, rollout) for name, folder in folders.items()}


def hotpotqa_scores(demo: Demo, folders: dict[str, Path], data: Path, questions: int) -> dict[str, dict]:
    """EM and F1 of each policy on the shared HotpotQA sample, the world's episode rules, BM25 over its paragraphs."""
    import yaml

    from r3_env.retrieval.index_builder import IndexBuildConfig, build_index

    index = build_index(IndexBuildConfig(corpus_path=str(data / "corpus.jsonl"), save_dir=str(demo.out / "hotpotqa")))
    config = demo.out / "hotpotqa" / "retriever.yaml"
    config.write_text(yaml.safe_dump({"retrieval_method": "bm25", "index_path": str(index)}))
    with (
        ServiceProcess(["retriever", "serve", "--config", str(config)]) as retriever,
        ServiceProcess(["reward", "serve", "--config", str(demo.out / "services" / "reward.yaml")]) as reward,
    ):
        results = {}
        for name, folder in folders.items():
            scores = demo.evaluate(f"hotpotqa_{name}", folder, str(data / "dev.jsonl"), retriever.url, reward.url,
                                   max_questions=questions)  # fmt: skip
            final = scores["datasets"]["hotpotqa"]["final"]
            results[name] = {"em": final["em"], "f1": final["f1"]}
    return results


def seed_rows(args: argparse.Namespace, folder: Path, seed: int, hotpotqa: Path) -> list[dict]:
    """One seed's rows: read back from FOLDER/learning.json (refused when measured with other settings), else
    the demo (which resumes) and the policies' scoring, then saved there."""
    settings = {"model": args.model, "quick": args.quick, "hotpotqa": args.hotpotqa}
    if args.hotpotqa:
        settings["data"] = str(hotpotqa.resolve())
    saved = folder / "learning.json"
    if saved.is_file():
        record = json.loads(saved.read_text())
        if record["settings"].get("hotpotqa"):  # rows saved before the sample's path was recorded used the default
            record["settings"].setdefault("data", str((SHARED_DATA / "hotpotqa").resolve()))
        if record["settings"] != settings:
            sys.exit(f"{saved} was measured with {record['settings']}, not {settings}: give another --out")
        print(f"seed {seed}: read back from {saved}", flush=True)
        return record["rows"]
    started = time.perf_counter()
    demo = Demo(DemoConfig(out=str(folder), model=args.model, seed=seed, quick=args.quick))
    results = demo.run()
    folders = policy_folders(demo)
    rewards = policy_rewards(demo, folders)
    real = hotpotqa_scores(demo, folders, hotpotqa, args.hotpotqa) if args.hotpotqa else {}
    rows = [
        {
            "seed": seed,
            "policy": name,
            "em": results[name]["em"],
            "f1": results[name]["f1"],
            "answered": results[name]["answered"],
            "reward": rewards[name]["reward"],
            "format_error": rewards[name]["format_error"],
            "correct": rewards[name]["correct"],
            **{f"hotpotqa_{key}": value for key, value in real.get(name, {}).items()},
        }
        for name in POLICIES
    ]
    seconds = time.perf_counter() - started
    saved.write_text(json.dumps({"settings": settings, "seconds": round(seconds), "rows": rows}, indent=2) + "\n")
    print(f"seed {seed}: demo and reward evaluation in {seconds:.0f} s", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--model", default="tiny-random", help="the demo's --model")
    parser.add_argument("--quick", action="store_true", help="the --quick demo budget")
    parser.add_argument("--hotpotqa", type=int, default=0, help="also answer this many shared HotpotQA questions")
    parser.add_argument("--data", default=str(SHARED_DATA), help="the shared samples' folder")
    parser.add_argument("--out", default="bench_out/demo_learning")
    args = parser.parse_args()
    hotpotqa = Path(args.data) / "hotpotqa"
    if args.hotpotqa and not (hotpotqa / "dev.jsonl").is_file():
        sys.exit(f"--hotpotqa needs the shared HotpotQA sample: {hotpotqa}/dev.jsonl is missing (--data)")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    out = Path(args.out)
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        rows += seed_rows(args, out / f"seed{seed}", seed, hotpotqa)
    (out / "demo_learning.json").write_text(json.dumps(rows, indent=2) + "\n")
    extra = f"{'HotpotQA EM %':>16}{'HotpotQA F1 %':>16}" if args.hotpotqa else ""
    print(f"\n{'policy':<11}{'dev EM %':>16}{'dev F1 %':>16}{'mean reward':>18}{'format errors %':>18}{extra}")
    for name in POLICIES:
        mine = [r for r in rows if r["policy"] == name]

        def spread(key: str, scale: float = 1.0, mine: list = mine) -> str:
            values = [scale * r[key] for r in mine]
            deviation = statistics.stdev(values) if len(values) > 1 else 0.0
            return f"{statistics.mean(values):.2f} ± {deviation:.2f}"

        print(
            f"{name:<11}{spread('em', 100):>16}{spread('f1', 100):>16}{spread('reward'):>18}"
            f"{spread('format_error', 100):>18}"
            + (f"{spread('hotpotqa_em', 100):>16}{spread('hotpotqa_f1', 100):>16}" if args.hotpotqa else "")
        )
    seeds = len(rows) // len(POLICIES)
    print(
        f"({seeds} seed{'s' if seeds > 1 else ''}; mean ± standard deviation over seeds"
        + (f"; HotpotQA: the first {args.hotpotqa} questions of the shared sample)" if args.hotpotqa else ")")
    )


if __name__ == "__main__":
    main()
