"""bench/rl_gain.py's tables: per-question scores of each arm's seeds into means and paired bootstrap differences
per dataset, question type and answer form, as markdown; and the saved arms of other benches (``--against``).

Kept apart from the runner so that the statistics and the tables read on their own and are tested without training.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.compare import seeded_paired_bootstrap

METRICS = ("em", "f1", "full_recall", "docs", "answered", "format_error")
# shown with their CI in the markdown table (rl_gain.json has every metric's)
CI_METRICS = ("em", "f1", "full_recall")
RATES = ("em", "f1", "full_recall", "answered", "format_error")  # shown in %
LABELS = {"em": "EM", "f1": "F1", "full_recall": "Full-Recall", "docs": "docs", "answered": "answered",
          "format_error": "format err"}  # fmt: skip
RESULT = "result.json"  # an (arm, seed)'s per-question scores, in OUT/ARM/seedS
TRAJECTORIES = "trajectories.jsonl"  # an RL arm's training episodes, in its train folder


def seed_mean(per_seed: Sequence[dict[str, dict[str, Any]]], key: str, metric: str) -> float | None:
    """One question's score averaged over an arm's seeds (None when no seed has it)."""
    values = [rows[key][metric] for rows in per_seed if scored(rows, key, metric)]
    return statistics.fmean(values) if values else None


def scored(rows: dict[str, dict[str, Any]], key: str, metric: str) -> bool:
    """Whether one seed's scores have ``metric`` for question ``key`` (None: not defined there)."""
    return key in rows and rows[key].get(metric) is not None


SPLITS = ("type", "form")  # how a dataset's questions are split in the table


def split_group(info: dict[str, str], split: str) -> str | None:
    """The group a question falls in under ``split``: its dataset's question type, or its answer form (None when
    the question has no form)."""
    if split == "type":
        return f"{info['dataset']} / {info['type']}"
    return f"{info['dataset']} / {info['form']} answers" if info.get("form") else None


def build_table(
    arms: dict[str, list[dict[str, dict[str, Any]]]],
    questions: dict[str, dict[str, str]],
    resamples: int = 2000,
    seed: int = 0,
    base: str = "sft",
    splits: Sequence[str] = SPLITS,
) -> list[dict[str, Any]]:
    """The table's rows: per group of questions (each dataset; each dataset's question types and its closed and
    open answers where it has several, as ``splits`` asks; all of them, not split, when there are several
    datasets) and per arm, the means and the paired differences to ``base``.

    ``arms``: arm -> its seeds' per-question scores (question key -> metric -> value); ``questions``:
    question key -> {"dataset", "type", "form"}, the questions every arm is compared on ("form", the
    question's :func:`r3_env.answers.answer_form`, may be left out).
    """
    if unknown := set(splits) - set(SPLITS):
        raise ValueError(f"splits: {sorted(unknown)}; choose from {', '.join(SPLITS)}")
    groups: dict[str, list[str]] = defaultdict(list)
    datasets = sorted({info["dataset"] for info in questions.values()})
    for key, info in questions.items():
        groups[info["dataset"]].append(key)
        for split in splits:
            if group := split_group(info, split):
                groups[group].append(key)
    if len(datasets) > 1:
        groups["all"] = list(questions)
    order = ["all"] if len(datasets) > 1 else []
    for name in datasets:
        order.append(name)
        for split in splits:
            named = sorted(
                {g for info in questions.values() if info["dataset"] == name and (g := split_group(info, split))}
            )
            order += named if len(named) > 1 else []
    reference = arms.get(base)
    rows = []
    for group in order:
        keys = groups[group]
        for arm, per_seed in arms.items():
            row: dict[str, Any] = {"group": group, "arm": arm, "seeds": len(per_seed), "mean": {}, "diff": {}}
            row["questions"] = sum(any(key in rows for rows in per_seed) for key in keys)
            for metric in METRICS:
                mine = {key: seed_mean(per_seed, key, metric) for key in keys}
                values = [v for v in mine.values() if v is not None]
                row["mean"][metric] = statistics.fmean(values) if values else None
                if reference is None:
                    continue
                paired = [key for key in keys if all(scored(rows, key, metric) for rows in (*per_seed, *reference))]
                if paired:
                    row["diff"][metric] = seeded_paired_bootstrap(
                        [[rows[key][metric] for key in paired] for rows in per_seed],
                        [[rows[key][metric] for key in paired] for rows in reference],
                        resamples,
                        seed,
                    )
            rows.append(row)
    return rows


def format_versus_bm25(checks: dict[str, dict[str, dict[str, dict[str, float]]]]) -> str:
    """:meth:`RLGain.versus_bm25` as a markdown table: a run per row, a dataset per column ("" without RL arms)."""
    datasets = list(dict.fromkeys(name for runs in checks.values() for run in runs.values() for name in run))
    if not datasets:
        return ""
    lines = ["Full-Recall % of each RL run against single-shot BM25 at the run's own documents (K: its mean "
             "documents per dataset, rounded; then per question, K: the documents that question's episode read):",
             "", f"| run | {' | '.join(datasets)} |", f"|---|{'---|' * len(datasets)}"]  # fmt: skip
    for arm, runs in checks.items():
        for label, per_dataset in runs.items():
            cells = []
            for name in datasets:
                check = per_dataset[name]
                diff = 100 * (check["full_recall"] - check["bm25_full_recall"])
                own = 100 * (check["full_recall"] - check["bm25_own_full_recall"])
                cells.append(f"{100 * check['full_recall']:.1f} vs {100 * check['bm25_full_recall']:.1f} at K = "
                             f"{check['k']} ({diff:+.1f}{', below' if diff < 0 else ''}); vs "
                             f"{100 * check['bm25_own_full_recall']:.1f} per question ({own:+.1f}"
                             f"{', below' if own < 0 else ''})")  # fmt: skip
            lines.append(f"| {arm}, {label} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def training_search(folder: Path) -> dict[str, Any] | None:
    """What searching paid in an RL seed's training episodes (r3_env.openrlhf.figures' summary of its trajectory
    log: the whole run, its first half and its last half); None when the run kept no log."""
    from r3_env.openrlhf.figures import training_figures

    path = folder / "train" / TRAJECTORIES
    return training_figures([path]) if path.is_file() else None


def format_training_search(runs: dict[str, dict[str, Any]]) -> str:
    """:func:`training_search` per RL seed (``runs``: {label: its summary}) as markdown ("" without any)."""
    if not runs:
        return ""

    def percent(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.0f}"

    def reward(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = ["What searching paid in each RL run's training episodes (found gold: the episode's searches found a "
             "gold passage its start lacked; RL can only learn to search from episodes where searching paid):", "",
             "| run | episodes | searched % (first half -> last half) | found gold, episodes (%) | "
             "mean reward, searched | mean reward, not searched |", "|---|---|---|---|---|---|"]  # fmt: skip
    for label, summary in runs.items():
        whole, first, last = summary["all"], summary["first_half"], summary["last_half"]
        lines.append(f"| {label} | {whole['episodes']} | {percent(first['searched'])} -> {percent(last['searched'])} | "
                     f"{whole['found_gold_episodes']} ({100 * (whole['found_gold'] or 0.0):.1f}) | "
                     f"{reward(whole['reward_searched'])} | "
                     f"{reward(whole['reward_not_searched'])} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def format_table(rows: list[dict[str, Any]], note: str = "", base: str = "sft") -> str:
    """The rows as markdown, one table per group of questions (differences to ``base``)."""

    def cell(value: float | None, metric: str) -> str:
        if value is None:
            return "-"
        return f"{100 * value:.1f}" if metric in RATES else f"{value:.2f}"

    def ci(diff: dict[str, float] | None, metric: str) -> str:
        if not diff:
            return "-"
        scale, digits = (100, 1) if metric in RATES else (1, 2)
        mean, lo, hi = (f"{scale * diff[key]:+.{digits}f}" for key in ("mean", "lo", "hi"))
        return f"{mean} [{lo}, {hi}]"

    header = ["arm", "seeds", "questions"]
    for metric in METRICS:
        header.append(LABELS[metric] + (" %" if metric in RATES else ""))
        if metric in CI_METRICS:
            header.append(f"Δ{LABELS[metric]} vs {base} [95% CI]")
    lines = []
    for group in dict.fromkeys(row["group"] for row in rows):
        title = group if base == "sft" else f"{group} against {base}"
        lines += [f"\n### {title}\n", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row in (r for r in rows if r["group"] == group):
            cells = [row["arm"], str(row["seeds"]), str(row["questions"])]
            for metric in METRICS:
                cells.append(cell(row["mean"][metric], metric))
                if metric in CI_METRICS:
                    cells.append(ci(row["diff"].get(metric), metric))
            lines.append("| " + " | ".join(cells) + " |")
    if note:
        lines += ["", note]
    return "\n".join(lines).lstrip("\n") + "\n"


def comparison_rows(
    arms: dict[str, list[dict[str, dict[str, Any]]]], questions: dict[str, dict[str, str]], resamples: int, base: str
) -> list[dict[str, Any]]:
    """Every arm but ``base`` minus ``base``, per dataset (and all of them when there are several) and per answer
    form, without per-type rows: a short table beside the main one. Closed answers apart, because a guess
    between the question's two names raises EM there without retrieval."""
    return [row for row in build_table(arms, questions, resamples, base=base, splits=("form",)) if row["arm"] != base]


@dataclass
class OtherArm:
    """``--against``'s arm: its label (OUT's name/arm), and per seed its scores, its policy and the episode
    rules its evaluation ran under where they differ from this bench's (empty: the same)."""

    label: str
    scores: list[dict[str, dict[str, Any]]]
    policies: list[str]
    rules_differ: list[dict[str, Any]]
    seeds: list[int | None]

    @property
    def is_rl(self) -> bool:
        return is_rl_arm(self.label)


def is_rl_arm(name: str) -> bool:
    """Whether an arm, this bench's (``rl_gold``) or another's (``OUT/rl_gold``), is an RL arm, whose Full-Recall
    the goal sets beside BM25's."""
    return name.rsplit("/", 1)[-1].startswith("rl_")


def evaluation_rules_differ(result: dict[str, Any], demo_out: Path, env: dict[str, Any]) -> dict[str, Any]:
    """The episode rules under which ``result`` was evaluated that differ from ``env``: {key: its value}."""
    from r3_env.env import env_defaults

    run = demo_out / "eval" / Path(result.get("eval_run", "")).name / "run.json"
    if not env or not result.get("eval_run") or not run.is_file():
        return {}
    # a rule newer than that run is at its default there
    ran = env_defaults() | json.loads(run.read_text())["env"]
    return {key: ran.get(key) for key, value in env.items() if ran.get(key) != value}


def seed_of(path: Path) -> int | None:
    """The seed a result file's folder names (OUT/ARM/seedS/result.json), None for OUT/ARM/result.json."""
    name = path.parent.name
    return int(name.removeprefix("seed")) if name.startswith("seed") and name[4:].isdigit() else None


def read_other_arm(
    folder: Path, questions: dict[str, dict[str, str]], demo_out: Path, env: dict[str, Any] | None = None
) -> OtherArm:
    """``--against``'s arm of another bench OUT, from FOLDER/result.json or FOLDER/seedN/result.json.

    Refused unless that bench ran on this demo (its OUT/rl_gain.json names the demo: world question ids
    repeat across worlds), its seeds share their settings, and every seed scored every question compared
    here, since a difference is only paired on the same questions. ``env``: this bench's episode rules; a
    seed evaluated under others is marked (``rules_differ``) for evaluating again under these."""
    folder = folder.resolve()
    fix = "give an arm folder of another bench on the same --demo, e.g. OUT/sft"
    summary = folder.parent / "rl_gain.json"
    try:
        demo = json.loads(summary.read_text())["demo"]
    except (OSError, ValueError, KeyError) as error:
        raise ValueError(f"--against {folder}: no bench summary {summary} naming its demo ({error}); {fix}") from None
    if Path(demo).resolve() != demo_out.resolve():
        raise ValueError(f"--against {folder}: that bench ran on the demo {demo}, not {demo_out.resolve()}; {fix}")
    paths = [folder / RESULT] if (folder / RESULT).is_file() else sorted(folder.glob(f"seed[0-9]*/{RESULT}"))
    if not paths:
        raise ValueError(f"--against {folder}: no {RESULT} there or in its seed folders; {fix}")
    results = []
    for path in paths:
        try:
            result = json.loads(path.read_text())
            results.append((path, result, {**result["settings"], "seed": None}))
            if not isinstance(result["scores"], dict):
                raise TypeError("scores is not a mapping of question ids")
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"--against {folder}: {path} is not a bench result (no scores or settings: "
                             f"{error}); {fix}") from None  # fmt: skip
    for path, result, settings in results:
        if settings != results[0][2]:
            raise ValueError(f"--against {folder}: {path} was trained with {settings}, {results[0][0]} with "
                             f"{results[0][2]}; give a folder whose seeds share their settings")  # fmt: skip
        if missing := [key for key in questions if key not in result["scores"]]:
            raise ValueError(f"--against {folder}: {path} has no score for {len(missing)} of the {len(questions)} "
                             f"questions compared here (e.g. {missing[0]}); {fix}, evaluated with the same "
                             f"--dev_questions")  # fmt: skip
    differ = [evaluation_rules_differ(result, demo_out, env or {}) for _, result, _ in results]
    policies = [result.get("policy", "") for _, result, _ in results]
    for (path, _, _), rules, policy in zip(results, differ, policies, strict=True):
        if rules and not (Path(policy) / "config.json").is_file():
            raise ValueError(f"--against {folder}: {path} was evaluated with env {rules}, other rules than "
                             f"this bench's, and its policy {policy or '(none recorded)'} is gone, so it cannot "
                             "be evaluated again; give an arm whose policy is saved")  # fmt: skip
    return OtherArm(
        f"{folder.parent.name}/{folder.name}",
        [result["scores"] for _, result, _ in results],
        policies,
        differ,
        [result.get("seed", seed_of(path)) for path, result, _ in results],
    )


def seed_summary(result: dict[str, Any]) -> dict[str, Any]:
    """One (arm, seed)'s means over every question it was evaluated on, and its training wall time."""
    means = {}
    for metric in METRICS:
        values = [row[metric] for row in result["scores"].values() if row[metric] is not None]
        means[metric] = statistics.fmean(values) if values else None
    return {"seed": result["seed"], "train_s": result["train_s"], **means}
