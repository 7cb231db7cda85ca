"""PPO again from a finished demo's SFT policy with other settings: what moves PPO's effect on the policy.

    python bench/ppo_ablation.py --demo DEMO_OUT --set ppo.actor_lr=1e-5 --set ppo.temperature=0.7
        [--set ppo.iterations=8] [--rollout_engine vllm] [--name NAME]

Each ``--set`` is a dotted key of ``r3rag train local`` (``ppo.actor_lr``, ``ppo.init_kl_coef``,
``ppo.critic_warmup``, ``reward.scheme``, ``model.lora_rank``, ...), applied on top of the demo's own
PPO settings. The run goes to DEMO_OUT/ablations/NAME (a rerun resumes). The new policy is then
scored as ``bench/demo_learning.py`` scores the demo's: dev EM and F1 through the demo's evaluation,
and the mean training reward of greedy dev episodes. It is printed beside the demo's SFT and PPO
policies, with what PPO did to the actor (KL, clipped ratios, the sampled episodes' reward). The
rows are kept in DEMO_OUT/ablations/NAME/ablation.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from demo_learning import policy_rewards  # noqa: E402

from demo.run import Demo  # noqa: E402
from r3_env.allocator import keep_freed_memory  # noqa: E402
from r3_env.config import ConfigError  # noqa: E402


def parse_settings(pairs: list[str]) -> dict[str, str]:
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {pair!r}: write KEY=VALUE with a dotted key, e.g. --set ppo.actor_lr=1e-5")
        settings[key] = value
    return settings


def actor_summary(run: Path) -> dict[str, float]:
    """What PPO did to the actor: iterations that trained it, KL to the reference, clipped ratios, sampled rewards."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ppo = [row for row in rows if row["stage"] == "ppo"]
    trained = [row for row in ppo if row.get("actor_trained")]
    return {
        "actor_iterations": len(trained),
        "kl_max": max((abs(row["kl"]) for row in ppo if "kl" in row), default=0.0),
        "clip_ratio": statistics.mean(row["clip_ratio"] for row in trained) if trained else 0.0,
        "sampled_reward": statistics.mean(row["reward"] for row in ppo),
        "sampled_correct": statistics.mean(row["correct"] for row in ppo),
    }


def demo_rewards(demo_out: Path) -> dict[str, dict[str, float]]:
    """The SFT and PPO policies' greedy-episode rewards as bench/demo_learning.py saved them, if it did."""
    saved = demo_out / "learning.json"
    if not saved.is_file():
        return {}
    keys = ("reward", "format_error", "correct")
    rows = json.loads(saved.read_text())["rows"]
    return {row["policy"]: {key: row[key] for key in keys} for row in rows if row["policy"] in ("sft", "ppo")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo", required=True, help="a finished demo's --out folder")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a dotted training setting")
    parser.add_argument("--name", default="", help="the run's folder under DEMO/ablations (default: from --set)")
    parser.add_argument("--rollout_engine", choices=("hf", "vllm"), default="hf", help="as r3rag demo's")
    parser.add_argument("--vllm_python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        demo, record = Demo.from_folder(args.demo, rollout_engine=args.rollout_engine, vllm_python=args.vllm_python)
    except ValueError as error:
        sys.exit(f"--demo: {error}")
    if set(record.get("results", {})) != {"untrained", "sft", "ppo"}:
        sys.exit(f"--demo: {args.demo} has not finished (no PPO evaluation yet); let its demo run finish first")
    try:
        settings = parse_settings(args.set)
    except ConfigError as error:
        sys.exit(str(error))
    if not settings:
        sys.exit("--set: give at least one setting to change, e.g. --set ppo.actor_lr=1e-5")
    name = args.name or "_".join(f"{key.split('.')[-1]}{value}" for key, value in settings.items())
    name = re.sub(r"[^A-Za-z0-9.+-]+", "_", name)
    folder = Path(args.demo) / "ablations" / name
    data = demo.sources()
    saved = folder / "ablation.json"
    kept = json.loads(saved.read_text()) if saved.is_file() else {}
    if kept.get("settings") == settings:
        rows = kept["rows"]
        print(f"read back from {saved}", flush=True)
    else:
        with demo.serving() as urls:
            try:
                policy = demo.ppo_again(settings, folder / "train", urls)
            except ConfigError as error:
                sys.exit(str(error))
            scores = demo.evaluate(f"ablation_{name}", policy, data.eval, *urls)
        folders = {"sft": demo.finished_sft_policy(), "ppo": Path(record["paths"]["ppo_policy"]), name: policy}
        rewards = demo_rewards(Path(args.demo))  # bench/demo_learning.py's, when it has scored this demo
        rewards.update(policy_rewards(demo, {key: value for key, value in folders.items() if key not in rewards}))
        final = {**{key: record["results"][key] for key in ("sft", "ppo")}, name: scores["average"]["final"]}
        # the PPO runs, for what they did (the demo's own is its SFT run's, unless RL had a run of its own)
        runs = {"ppo": Path(record["paths"].get("rl", record["paths"]["train"])), name: folder / "train"}
        rows = [
            {"policy": key, "em": final[key]["em"], "f1": final[key]["f1"], **rewards[key],
             **(actor_summary(runs[key]) if key in runs else {})}
            for key in folders
        ]  # fmt: skip
        folder.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps({"settings": settings, "rows": rows}, indent=2) + "\n")
    columns = ("dev EM %", "dev F1 %", "mean reward", "format err %", "actor iterations", "max |KL|", "clipped %",
               "sampled reward", "sampled correct %")  # fmt: skip
    print(f"\n{'policy':<28}" + "".join(f"{c:>19}" for c in columns))
    for row in rows:
        cells = [f"{100 * row['em']:.1f}", f"{100 * row['f1']:.1f}", f"{row['reward']:.3f}",
                 f"{100 * row['format_error']:.1f}"]  # fmt: skip
        if "actor_iterations" in row:
            cells += [str(row["actor_iterations"]), f"{row['kl_max']:.2e}", f"{100 * row['clip_ratio']:.2f}",
                      f"{row['sampled_reward']:.3f}", f"{100 * row['sampled_correct']:.1f}"]  # fmt: skip
        text = "".join(f"{cell:>19}" for cell in cells)
        print(f"{row['policy']:<28}{text}")
    print(f"(demo {args.demo}; changed: {', '.join(f'{k}={v}' for k, v in settings.items())}; "
          f"{demo.budget.eval_questions} dev questions, greedy)")  # fmt: skip


if __name__ == "__main__":
    keep_freed_memory()  # PyTorch's buffers kept between steps: r3_env/allocator.py
    main()
