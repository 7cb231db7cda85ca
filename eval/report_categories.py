"""The report's answer categories ("Learning when to search"): where retrieval helps and where it adds noise.

A run with retrieval and a run without, over the same questions, split each dataset's questions
in four: correct in both, correct only with retrieval, correct only without (retrieval added
noise), wrong in both. Questions are matched by dataset and id (``question_scores.jsonl``); one
that only one of the two runs has (it failed, or the runs sampled other questions) is left out
and counted. "Correct" is the report's headline metric: ACC when every run was judged, else EM.

Pairing: the runs without retrieval are those whose method retrieves nothing (run.json's
retriever ``none``, e.g. ``direct``; a policy that could retrieve but never did is a run with
retrieval, RC 0), unless ``--baseline`` names them. Every other run is paired with the one of
the same model that shares a dataset with it; several such runs are ambiguous (the note says to
choose with ``--baseline``), and a run named with ``--baseline`` when it is the only one pairs
with every run, whatever its model.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eval.report import Run, _e, _md_table
from r3_env.answers import judged_correct
from r3_env.data import iter_jsonl

logger = logging.getLogger(__name__)

# (key, name, colour), in the order of a bar's segments from the left
CATEGORIES = (
    ("both", "correct in both", "#2ca02c"),
    ("retrieval_only", "correct only with retrieval", "#1f77b4"),
    ("no_retrieval_only", "correct only without retrieval (noise)", "#ff7f0e"),
    ("neither", "wrong in both", "#8e959e"),
)
METRIC_NAMES = {"acc": "ACC, the judge's verdict", "em": "EM, as not every run was judged"}


def _named(runs: list[Run], root: Path, name: str) -> Run:
    """The run ``name`` means: its label, its run.json name, or its folder (from DIR or from here)."""
    folders = {(root / name).resolve(), Path(name).resolve()}
    found = [run for run in runs if name in (run.label, run.info.get("name")) or run.folder.resolve() in folders]
    if len(found) != 1:
        known = ", ".join(sorted({str(run.folder.relative_to(root)) for run in runs}))
        why = "matches several runs" if found else "matches no scored run"
        raise ValueError(f"--baseline {name!r} {why}: give a run's folder under {root} ({known})")
    if found[0].retrieves:
        logger.warning("--baseline %s retrieves: its categories compare two runs with retrieval", found[0].label)
    return found[0]


def pair_runs(runs: list[Run], root: Path, baselines: Sequence[str] = ()) -> tuple[list[tuple[Run, Run]], list[str]]:
    """(run with retrieval, run without) pairs, and a note for each run with retrieval that got none."""
    chosen = [_named(runs, root, name) for name in baselines] or [run for run in runs if not run.retrieves]
    pairs, notes = [], []
    for run in runs:
        if run in chosen or not run.retrieves or not chosen:
            continue
        shared = [base for base in chosen if set(base.scores["datasets"]) & set(run.scores["datasets"])]
        candidates = [base for base in shared if base.info.get("model") == run.info.get("model")]
        if not candidates and len(chosen) == 1 and baselines:
            candidates = shared  # named by the user: across models too
        if len(candidates) == 1:
            pairs.append((run, candidates[0]))
        elif candidates:
            names = ", ".join(base.label for base in candidates)
            notes.append(
                f"{run.label}: several runs without retrieval could pair with it ({names}); pick with --baseline"
            )
        else:
            notes.append(f"{run.label}: no run without retrieval of its model over its datasets")
    return pairs, notes


def _verdicts(run: Run, metric: str) -> dict[str, dict[str, bool]] | None:
    """Dataset -> question id -> correct at the run's own step limit; None when the file is missing."""
    path = run.folder / "question_scores.jsonl"
    if not path.exists():
        return None
    verdicts: dict[str, dict[str, bool]] = defaultdict(dict)
    for _, row in iter_jsonl(path):
        verdicts[row["dataset"]][row["id"]] = judged_correct(row.get(metric) or 0.0)
    return verdicts


def count_categories(with_retrieval: dict[str, bool], without: dict[str, bool]) -> dict[str, int]:
    """The four categories over the questions both runs have; ``excluded``: those only one has."""
    counts = {key: 0 for key, _, _ in CATEGORIES}
    common = with_retrieval.keys() & without.keys()
    for question in common:
        right, right_without = with_retrieval[question], without[question]
        if right and right_without:
            counts["both"] += 1
        elif right:
            counts["retrieval_only"] += 1
        elif right_without:
            counts["no_retrieval_only"] += 1
        else:
            counts["neither"] += 1
    return {**counts, "compared": len(common), "excluded": len(with_retrieval.keys() ^ without.keys())}


def answer_categories(
    runs: list[Run], root: Path, datasets: list[str], metric: str, baselines: Sequence[str] = ()
) -> dict[str, Any]:
    """The categories per pair of runs and dataset (report.json's ``categories``)."""
    pairs, notes = pair_runs(runs, root, baselines)
    rows = []
    for run, base in pairs:
        ours, theirs = _verdicts(run, metric), _verdicts(base, metric)
        if ours is None or theirs is None:
            notes.append(f"{run.label} vs {base.label}: no question_scores.jsonl; rescore with `r3rag eval score`")
            continue
        common = [name for name in datasets if name in ours and name in theirs]
        counts = {name: count_categories(ours[name], theirs[name]) for name in common}
        rows.append({"run": run.label, "baseline": base.label, "datasets": counts})
    excluded = sum(counts["excluded"] for row in rows for counts in row["datasets"].values())
    if excluded:
        notes.append(f"{excluded} question(s) in only one run of their pair are left out (column 'left out')")
    return {"metric": metric, "pairs": rows, "notes": notes}


HEADER = [
    "dataset",
    "with retrieval",
    "without retrieval",
    *(name for _, name, _ in CATEGORIES),
    "compared",
    "left out",
]


def _table_rows(categories: dict[str, Any], datasets: list[str]) -> list[list[str]]:
    return [
        [name, pair["run"], pair["baseline"], *(str(counts[key]) for key, _, _ in CATEGORIES),
         str(counts["compared"]), str(counts["excluded"])]
        for name in datasets for pair in categories["pairs"] if (counts := pair["datasets"].get(name))
    ]  # fmt: skip


def categories_markdown(categories: dict[str, Any], datasets: list[str]) -> list[str]:
    if not categories["pairs"] and not categories["notes"]:
        return []
    lines = ["", f"## Answer categories (questions; correct: {METRIC_NAMES[categories['metric']]})", ""]
    table = _md_table(HEADER, _table_rows(categories, datasets)) if categories["pairs"] else []
    notes = [f"- {note}" for note in categories["notes"]]
    return lines + table + ([""] if table and notes else []) + notes


def categories_chart(categories: dict[str, Any], datasets: list[str]) -> str:
    """Horizontal stacked bars as inline SVG: per dataset, one bar per pair, segments in % of the questions compared."""
    width, label_w, plot_w, bar_h, gap, group_h = 600, 196, 384, 18, 6, 20
    bars, y = [], 4
    for name in datasets:
        shown = [(pair, counts) for pair in categories["pairs"] if (counts := pair["datasets"].get(name))]
        shown = [(pair, counts) for pair, counts in shown if counts["compared"]]
        if not shown:
            continue
        bars.append(f'<text x="0" y="{y + 14}" class="group-label">{_e(name)}</text>')
        y += group_h
        for pair, counts in shown:
            label = pair["run"] if len(pair["run"]) <= 30 else pair["run"][:29] + "…"
            bars.append(
                f'<g class="bar" data-dataset="{_e(name)}" data-run="{_e(pair["run"])}">'
                f'<text x="{label_w - 8}" y="{y + 13}" text-anchor="end">{_e(label)}'
                f"<title>{_e(pair['run'])} vs {_e(pair['baseline'])}</title></text>"
            )
            x = float(label_w)
            for key, title, color in CATEGORIES:
                share, total = counts[key] / counts["compared"], counts["compared"]
                tip = f"{name}, {pair['run']} vs {pair['baseline']}: {title}: {counts[key]} of {total}"
                bars.append(
                    f'<rect class="segment" data-category="{key}" x="{x:.1f}" y="{y}" width="{share * plot_w:.1f}" '
                    f'height="{bar_h}" fill="{color}"><title>{_e(tip)} ({100 * share:.1f}%)</title></rect>'
                )
                if share * plot_w >= 24:  # room for the count inside the segment
                    middle = x + share * plot_w / 2
                    bars.append(
                        f'<text x="{middle:.1f}" y="{y + 13}" text-anchor="middle" class="count">{counts[key]}</text>'
                    )
                x += share * plot_w
            bars.append("</g>")
            y += bar_h + gap
    grid = []
    for tick in range(0, 101, 25):
        x = label_w + tick / 100 * plot_w
        grid.append(f'<line x1="{x:.1f}" y1="4" x2="{x:.1f}" y2="{y + 2}" class="grid"/>')
        grid.append(f'<text x="{x:.1f}" y="{y + 17}" text-anchor="middle">{tick}</text>')
    grid.append(
        f'<text x="{label_w + plot_w / 2}" y="{y + 34}" text-anchor="middle" class="axis-label">'
        "share of the questions both runs have (%)</text>"
    )
    head = f'<svg viewBox="0 0 {width} {y + 42}" role="img" class="chart" aria-label="answer categories">'
    return head + "".join(grid + bars) + "</svg>"


def categories_html(categories: dict[str, Any], datasets: list[str]) -> str:
    """The section: the chart with its legend, the counts table, the notes."""
    notes = "".join(f'<p class="note">{_e(note)}</p>' for note in categories["notes"])
    heading = "<h2>Answer categories: with and without retrieval</h2>"
    if not categories["pairs"]:
        return (
            f'{heading}<p id="plot-categories" class="empty">No pair of a run with retrieval and one without over '
            "the same questions: add a run of the same model with <code>--method direct</code>, or name one with "
            f"<code>--baseline</code>.</p>{notes}"
        )
    legend = "".join(
        f'<li><span class="swatch" style="background:{color}"></span>{_e(title)}</li>' for _, title, color in CATEGORIES
    )
    caption = (
        "Answer categories per dataset: each bar is a run with retrieval against its run without, over the "
        f"questions both runs have. Correct: {METRIC_NAMES[categories['metric']]}."
    )
    head = "".join(f"<th>{_e(title)}</th>" for title in HEADER)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in row) + "</tr>" for row in _table_rows(categories, datasets)
    )
    return (
        f'{heading}<figure class="categories"><figcaption>{_e(caption)}</figcaption>'
        f'<div id="plot-categories" class="plot">{categories_chart(categories, datasets)}</div>'
        f'<ul class="legend">{legend}</ul></figure>'
        f'<table id="categories-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes}'
    )
