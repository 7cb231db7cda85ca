"""``python -m r3_env.openrlhf.figures``: the figures of one OpenRLHF run, as one JSON file.

``launch/smoke_1gpu.sh`` writes them at its end, from what the run left on disk:

- ``training``: the agent's trajectory log (``policy.trajectory_log``, ``TRAJECTORY_LOG`` in
  ``launch/ppo_r3.sh``): episodes, outcome shares, mean episode reward, retrievals and documents per
  episode, what searching paid (the shares of all episodes that searched and whose searches found a
  gold passage their start lacked; the mean reward with and without a search), over the whole run and over its
  first and last halves (the log is in rollout order);
- ``tensorboard``: every scalar OpenRLHF logged (``--logger.tensorboard_dir``), its number of
  points, first, last, lowest and highest value;
- ``eval``: the average over datasets of each scored evaluation run (``r3rag eval run`` + ``score``)
  found in the given folder, at the run's own step limit;
- ``stages_s``: the wall time of each stage, as the caller measured it (``--stage NAME=SECONDS``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from r3_env.data import iter_jsonl

# the headline numbers of a scored run (scores.json's average at the final cutoff)
EVAL_KEYS = ("acc", "em", "f1", "answered", "avg_steps", "avg_retrievals", "avg_docs", "recall", "full_recall")


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def _episode_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Outcome shares, reward, retrievals and documents; and what searching paid: the share of all episodes that
    searched, the share (``found_gold``) and number of all episodes whose searches found a gold passage their start
    lacked (0 without gold labels), and the mean reward of the episodes that searched and of those that did not.
    When searches seldom find anything, the reward cannot pay for them, and RL learns to answer without searching."""
    outcomes = Counter(str(r.get("outcome")) for r in records)
    rewards = [sum(r.get("step_rewards") or []) for r in records]
    retrievals = [sum(1 for s in r.get("steps") or [] if s.get("kind") == "query") for r in records]
    found = [float(any(s.get("new_gold") for s in r.get("steps") or [])) for r in records]
    return {
        "episodes": len(records),
        "reward": _mean(rewards),
        "outcomes": {name: round(count / len(records), 4) for name, count in sorted(outcomes.items())}
        if records
        else {},
        "retrievals": _mean(retrievals),
        "docs": _mean([float(r.get("num_docs") or 0) for r in records]),
        "searched": _mean([float(n > 0) for n in retrievals]),
        "found_gold": _mean(found),
        "found_gold_episodes": int(sum(found)),
        "reward_searched": _mean([reward for reward, n in zip(rewards, retrievals, strict=True) if n]),
        "reward_not_searched": _mean([reward for reward, n in zip(rewards, retrievals, strict=True) if not n]),
    }


def latest_attempts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The log's rows without those a resumed run redid.

    A trainer that knows its step (the local one) writes it and its run's id on each row. A resumed run
    starts again from its checkpoint's step, so the rows an earlier run wrote at that step or later are
    superseded. Rows without a step (OpenRLHF's rollout actors) are all kept."""
    kept: list[dict[str, Any]] = []
    run = None
    for row in records:
        step = row.get("training_step")
        if step is not None and row.get("run") != run:
            run = row.get("run")
            kept = [r for r in kept if r.get("training_step") is None or r["training_step"] < step]
        kept.append(row)
    return kept


def training_figures(files: list[Path]) -> dict[str, Any]:
    """The trajectory logs' episodes (a resumed run's redone ones once), summed up: all of them, the first half
    and the last half."""
    records = latest_attempts([row for path in files for _, row in iter_jsonl(path)])
    half = len(records) // 2
    return {
        "files": [str(path) for path in files],
        "all": _episode_summary(records),
        "first_half": _episode_summary(records[:half]),
        "last_half": _episode_summary(records[half:]),
    }


def tensorboard_figures(folder: Path) -> dict[str, Any]:
    """Each scalar tag under ``folder`` (every run folder in it): points, first, last, min, max."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        return {"error": "tensorboard is not installed: pip install tensorboard"}
    runs = sorted({path.parent for path in folder.rglob("events.out.tfevents.*")})
    scalars: dict[str, Any] = {}
    for run in runs:
        events = EventAccumulator(str(run), size_guidance={"scalars": 0})
        events.Reload()
        prefix = "" if len(runs) == 1 else f"{run.relative_to(folder)}/"
        for tag in events.Tags().get("scalars", []):
            values = [event.value for event in events.Scalars(tag) if math.isfinite(event.value)]
            if values:
                scalars[prefix + tag] = {
                    "points": len(values),
                    "first": round(values[0], 6),
                    "last": round(values[-1], 6),
                    "min": round(min(values), 6),
                    "max": round(max(values), 6),
                }
    return {"runs": [str(run) for run in runs], "scalars": scalars}


def eval_figures(folder: Path) -> dict[str, Any]:
    """The headline numbers of every scored run under ``folder``, by the run's folder name."""
    runs = {}
    for scores in sorted(folder.rglob("scores.json")):
        final = json.loads(scores.read_text())["average"]["final"]
        runs[scores.parent.name] = {key: final.get(key) for key in EVAL_KEYS}
    return runs


def _stage(text: str) -> tuple[str, float]:
    name, sep, seconds = text.partition("=")
    try:
        if not (sep and name):
            raise ValueError
        return name, float(seconds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a stage is NAME=SECONDS, got {text!r}") from None


def collect(
    trajectories: list[Path],
    tensorboard: Path | None,
    eval_dir: Path | None,
    stages: dict[str, float],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "stages_s": stages,
        "total_s": round(sum(stages.values()), 1),
        **(extra or {}),
        "training": training_figures(trajectories) if trajectories else None,
        "tensorboard": tensorboard_figures(tensorboard) if tensorboard and tensorboard.is_dir() else None,
        "eval": eval_figures(eval_dir) if eval_dir and eval_dir.is_dir() else {},
    }
    return figures


def format_figures(figures: dict[str, Any]) -> str:
    """A few lines for the terminal: time, training reward, evaluation."""

    def number(value: Any, percent: bool = False) -> str:
        if value is None:
            return "-"
        return f"{100 * value:.1f}" if percent else f"{value:.3f}"

    lines = ["time: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in figures["stages_s"].items())]
    lines[-1] += f"; total {figures['total_s']:.0f} s"
    training = figures.get("training")
    if training:
        first, last = training["first_half"], training["last_half"]
        lines.append(
            f"training: {training['all']['episodes']} episodes; mean reward {number(first['reward'])} (first half) "
            f"-> {number(last['reward'])} (last half); outcomes {training['all']['outcomes']}"
        )
    for name, row in figures.get("eval", {}).items():
        lines.append(
            f"eval {name}: ACC {number(row['acc'], True)} EM {number(row['em'], True)} F1 {number(row['f1'], True)} "
            f"answered {number(row['answered'], True)} retrievals {number(row['avg_retrievals'])}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m r3_env.openrlhf.figures", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument(
        "--trajectories", default="", help="a trajectory log, or a folder of them (*.jsonl, policy.trajectory_log)"
    )
    parser.add_argument("--tensorboard", default="", help="OpenRLHF's --logger.tensorboard_dir")
    parser.add_argument("--eval", default="", help="a folder of scored evaluation runs (r3rag eval run + score)")
    parser.add_argument("--stage", type=_stage, action="append", default=[], help="NAME=SECONDS, repeated")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another field, repeated")
    args = parser.parse_args(argv)
    trajectories: list[Path] = []
    if args.trajectories:  # a run that never got to its first rollout has none: no training figures then
        path = Path(args.trajectories)
        trajectories = sorted(path.glob("*.jsonl")) if path.is_dir() else [path] if path.is_file() else []
    extra = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not (sep and key):
            parser.error(f"--set takes KEY=VALUE, got {item!r}")
        extra[key] = value
    figures = collect(
        trajectories,
        Path(args.tensorboard) if args.tensorboard else None,
        Path(args.eval) if args.eval else None,
        dict(args.stage),
        extra,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(format_figures(figures))
    print(f"figures: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
