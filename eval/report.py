"""``r3rag eval report DIR``: every scored run under DIR as tables, sweep plots and a trajectory browser.

- ``report.md`` / ``report.json``: the paper's layout (rows: method and retriever; columns:
  datasets x ACC/F1/EM/RC, then the Average; RC is retrievals per question), a retrieval table,
  R2AG's retrieval table (the retrieval tree, ``rrt``, beside single-shot retrieval, ``single_shot``,
  at matched @K: Recall, Full-Recall, mAP, @K, iterations, retrieval and generation seconds per
  question; a note names the single-shot run still missing for an ``rrt`` run's @K),
  the answer categories of each run with retrieval against one without
  (:mod:`eval.report_categories`), and the two sweep curves (accuracy vs max steps: each run's
  step cutoffs; accuracy vs top-k: runs alike in all but ``env.topk``), per dataset and on average;
- ``report.html``: one self-contained page (no network): the same tables, the categories and
  both curves as inline SVG, and a trajectory browser filtered by run, dataset, verdict and step
  count, with gold documents marked. Text from datasets and models is untrusted: Python escapes
  what it writes into HTML, the embedded JSON cannot close its <script>, and the page's script
  sets ``textContent`` only.

Accuracy in the curves and correctness in the categories is ACC when every run was judged, else
EM (the headings say which). Runs that retrieve without answering (``single_shot``) appear in the
retrieval tables and the trajectory browser only.
"""

from __future__ import annotations

import html
import json
import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.metrics import matched_k
from eval.report_page import PAGE_SCRIPT, PAGE_STYLE
from r3_env.data import Passage, iter_jsonl
from r3_env.env import env_defaults

logger = logging.getLogger(__name__)

ANSWER_COLUMNS = (("acc", "ACC"), ("f1", "F1"), ("em", "EM"), ("avg_retrievals", "RC"))  # RC: retrievals per question
RETRIEVAL_COLUMNS = (
    ("recall", "Recall"),
    ("full_recall", "Full-Recall"),
    ("map", "mAP"),
    ("avg_docs", "docs"),
    ("avg_steps", "steps"),
)
# R2AG's retrieval table (docs/recipes/r2ag.md#evaluation): the tree and single-shot retrieval at matched @K
TREE_COLUMNS = (
    ("recall", "Recall"),
    ("full_recall", "Full-Recall"),
    ("map", "mAP"),
    ("avg_docs", "@K"),
    ("iterations", "iterations"),
    ("retrieval_s", "retrieval s/q"),
    ("generation_s", "generation s/q"),
)
# averages shown as they are, not in %
COUNT_DECIMALS = {"avg_docs": 1, "avg_steps": 1, "avg_retrievals": 2, "iterations": 2, "retrieval_s": 3,
                  "generation_s": 3}  # fmt: skip
AVERAGE = "average"
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
DOC_CHARS = 2000  # document text kept per retrieved passage in the page (the page shows 300, more on request)
# the browser's first step of an episode that retrieved with the question before the policy's first step
QUESTION_SEARCH = "(the environment, before the first step: env.question_docs)"


@dataclass
class Run:
    """One scored run folder; ``label`` is its row name in every table and plot."""

    folder: Path
    scores: dict[str, Any]
    label: str = ""

    @property
    def info(self) -> dict[str, Any]:
        return self.scores.get("run") or {}

    @property
    def env(self) -> dict[str, Any]:
        """The run's episode rules; a rule added after the run was recorded ran at its default."""
        recorded = self.info.get("env") or {}
        return {**env_defaults(), **recorded} if recorded else {}

    @property
    def topk(self) -> int | None:
        return self.env.get("topk")

    @property
    def retrieves(self) -> bool:
        """False for a method that retrieves nothing (retriever "none", e.g. direct).

        A policy that could retrieve but chose not to (RC 0) still counts as a run with retrieval:
        what the categories compare is retrieval being available.
        """
        return self.info.get("retriever") != "none"

    @property
    def answers(self) -> bool:
        """False for a method that retrieves without answering (single_shot): no answer tables or curves."""
        return self.info.get("answers", True) is not False

    @property
    def tree_retrieval(self) -> bool:
        """Whether the run's rows are retrieval-only records (rrt, single_shot): R2AG's retrieval table."""
        return self.scores["average"]["final"].get("retrieval_s") is not None

    def cell(self, dataset: str) -> dict[str, Any] | None:
        """The final-cutoff metrics of ``dataset`` (or of the average), None when the run lacks it."""
        if dataset == AVERAGE:
            return self.scores["average"]["final"]
        data = self.scores["datasets"].get(dataset)
        return data["final"] if data else None

    def by_cutoff(self, dataset: str) -> dict[str, dict[str, Any]]:
        block = self.scores["average"] if dataset == AVERAGE else self.scores["datasets"].get(dataset, {})
        return block.get("by_cutoff", {})


def _base_label(info: dict[str, Any]) -> str:
    return f"{info.get('method', '?')} ({info.get('retriever', '?')})"


def _read_scores(folder: Path) -> dict[str, Any]:
    path = folder / "scores.json"
    try:
        scores = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}); rerun `r3rag eval score --run {folder}`") from error
    if not scores.get("run"):  # older scores: the manifest beside it says what the run was
        scores["run"] = json.loads((folder / "run.json").read_text())
    return scores


def find_runs(root: Path) -> list[Run]:
    """Scored runs under ``root`` (``root`` itself may be one); unscored ones are left out with a warning."""
    if not root.is_dir():
        raise ValueError(f"{root} is not a folder: give the folder an `r3rag eval run --out` wrote, or its parent")
    runs = []
    for manifest in sorted(root.rglob("run.json")):
        folder = manifest.parent
        if not (folder / "scores.json").exists():
            logger.warning("%s has no scores.json (run `r3rag eval score --run %s`); left out", folder, folder)
            continue
        runs.append(Run(folder, _read_scores(folder)))
    if not runs:
        raise ValueError(
            f"no scored run under {root}: run `r3rag eval score --run RUN` for each run folder (with run.json) first"
        )
    _label_runs(runs, root)
    return runs


def _label_runs(runs: list[Run], root: Path) -> None:
    """Row labels: method (retriever), plus the run's name where several share that, its folder if names clash."""
    base = [_base_label(run.info) for run in runs]
    for run, label in zip(runs, base, strict=True):
        run.label = label if base.count(label) == 1 else f"{label} {run.info.get('name') or run.folder.name}"
    labels = [run.label for run in runs]
    for run in runs:
        if labels.count(run.label) > 1:
            run.label = f"{_base_label(run.info)} {run.folder.relative_to(root).as_posix() or run.folder.name}"


def _datasets(runs: list[Run]) -> list[str]:
    """Datasets in the order the runs name them (run.json's list first), then the others sorted."""
    order: dict[str, None] = {}
    for run in runs:
        named = [d for d in run.info.get("datasets") or () if isinstance(d, str) and d in run.scores["datasets"]]
        for name in [*named, *sorted(run.scores["datasets"])]:
            order.setdefault(name, None)
    return list(order)


def curve_metric(runs: list[Run]) -> str:
    """ACC when every run had a judge, else EM: one curve must not mix the two."""
    return "acc" if runs and all(run.scores.get("judge") for run in runs) else "em"


def _row(run: Run, groups: list[str], columns: tuple) -> dict[str, Any]:
    cells = {group: run.cell(group) for group in groups}
    return {
        "run": run.label,
        **{key: run.info.get(key, "?") for key in ("name", "method", "retriever", "model")},
        "topk": run.topk,
        "scores": {g: {key: c.get(key) for key, _ in columns} for g, c in cells.items() if c is not None},
    }


def _run_summary(run: Run) -> dict[str, Any]:
    return {
        "run": run.label,
        "name": run.info.get("name", "?"),
        "method": run.info.get("method", "?"),
        "retriever": run.info.get("retriever", "?"),
        "model": run.info.get("model", "?"),
        "engine": run.info.get("engine", "?"),
        "topk": run.topk,
        "max_steps": (run.info.get("tree") or {}).get("max_iterations") or run.env.get("max_steps"),
        "question_docs": run.env.get("question_docs"),
        "judge": run.scores.get("judge"),
        "questions": sum(data.get("questions", 0) for data in run.scores["datasets"].values()),
        "folder": str(run.folder),
    }


def _cutoff_points(run: Run, group: str, metric: str) -> list[list[Any]]:
    curve = run.by_cutoff(group)
    return [[int(c), curve[str(c)][metric]] for c in run.scores.get("cutoffs", []) if str(c) in curve]


def steps_curves(runs: list[Run], groups: list[str], metric: str) -> list[dict[str, Any]]:
    """Each run's accuracy at every step cutoff, per dataset and on average."""
    return [{"run": run.label, "points": {g: _cutoff_points(run, g, metric) for g in groups}} for run in runs]


def topk_curves(runs: list[Run], groups: list[str], metric: str) -> list[dict[str, Any]]:
    """Runs whose run.json differs only in ``env.topk`` (and name): one curve per group of two or more."""
    alike: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        key = {k: v for k, v in run.info.items() if k not in ("name", "env")}
        key["env"] = {k: v for k, v in run.env.items() if k != "topk"}
        alike[json.dumps(key, sort_keys=True, default=str)].append(run)
    curves = []
    for group_runs in alike.values():
        group_runs = [run for run in group_runs if run.topk is not None]
        if len({run.topk for run in group_runs}) < 2:
            continue
        group_runs.sort(key=lambda run: run.topk)
        points = {
            group: [[run.topk, cell[metric]] for run in group_runs if (cell := run.cell(group)) is not None]
            for group in groups
        }
        first = group_runs[0].info
        series = {"series": _base_label(first), "runs": [run.label for run in group_runs], "model": first.get("model")}
        curves.append({**series, "points": points})
    names = [curve["series"] for curve in curves]
    for curve in curves:  # one method and retriever with several models: the model tells them apart
        if names.count(curve["series"]) > 1:
            curve["series"] += f" {curve['model']}"
    return curves


def build_tables(runs: list[Run], root: Path, baselines: Sequence[str] = ()) -> dict[str, Any]:
    """The report's content as data: what report.json holds and both renderings read.

    ``baselines``: the runs without retrieval to pair the others with (see :mod:`eval.report_categories`).
    """
    from eval.report_categories import answer_categories

    datasets = _datasets(runs)
    groups = [*datasets, AVERAGE]
    answering = [run for run in runs if run.answers]
    metric = curve_metric(answering)
    with_recall = [run for run in runs if any((run.cell(g) or {}).get("recall") is not None for g in groups)]
    trees = [run for run in with_recall if run.tree_retrieval]
    return {
        "metric": metric,
        "datasets": datasets,
        "runs": [_run_summary(run) for run in runs],
        "main": [_row(run, groups, ANSWER_COLUMNS) for run in answering],
        "retrieval": [_row(run, groups, RETRIEVAL_COLUMNS) for run in with_recall if not run.tree_retrieval],
        "tree_retrieval": [
            _row(run, groups, TREE_COLUMNS) | {"naive_topk": run.info.get("naive_topk")} for run in trees
        ],
        "tree_notes": matched_k_notes(trees, datasets),
        "categories": answer_categories(answering, root, datasets, metric, baselines),
        "steps_curves": steps_curves(answering, groups, metric),
        "topk_curves": topk_curves(answering, groups, metric),
    }


def matched_k_notes(runs: list[Run], datasets: list[str]) -> list[str]:
    """For each rrt run and dataset, whether a single_shot run at its @K (rounded) is in the table, and how to
    make it when not."""
    notes = []
    for run in runs:
        if run.info.get("method") != "rrt":
            continue
        for dataset in datasets:
            cell = run.cell(dataset)
            if cell is None:
                continue
            k = matched_k(cell["avg_docs"])
            if not any(other.info.get("method") == "single_shot" and other.info.get("naive_topk") == k
                       and other.cell(dataset) is not None for other in runs):  # fmt: skip
                notes.append(f"{run.label}: no single-shot run on {dataset} at its @K {cell['avg_docs']:.1f}; "
                             f"r3rag eval run --method single_shot --naive_topk {k} (over {dataset})")  # fmt: skip
    return notes


def _fmt(key: str, value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.{COUNT_DECIMALS[key]}f}" if key in COUNT_DECIMALS else f"{100 * value:.1f}"


def _cells(row: dict[str, Any], groups: list[str], columns: tuple) -> list[str]:
    return [_fmt(key, row["scores"].get(group, {}).get(key)) for group in groups for key, _ in columns]


TREE_TITLE = (
    "Retrieval tree vs single-shot (R2AG): Recall / Full-Recall / mAP in %, @K documents retrieved, iterations, "
    "retrieval and generation seconds per question"
)


# -- Markdown --------------------------------------------------------------------------------------


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cells) + " |" for cells in rows]


def _md_scores(rows: list[dict[str, Any]], datasets: list[str], columns: tuple) -> list[str]:
    groups = [*datasets, AVERAGE]
    header = ["run", *(f"{group} {title}" for group in groups for _, title in columns)]
    return _md_table(header, [[row["run"], *_cells(row, groups, columns)] for row in rows])


def _md_curves(curves: list[dict[str, Any]], name_key: str, group: str) -> list[str]:
    xs = sorted({x for curve in curves for x, _ in curve["points"][group]})
    rows = []
    for curve in curves:
        points = dict(curve["points"][group])
        rows.append([curve[name_key], *(_fmt("", points.get(x)) for x in xs)])
    return _md_table([name_key, *map(str, xs)], rows)


def render_markdown(tables: dict[str, Any]) -> str:
    from eval.report_categories import categories_markdown
    from eval.report_learned import learned_markdown

    datasets, metric = tables["datasets"], tables["metric"].upper()
    lines = ["# Evaluation report", "", *learned_markdown(tables.get("learned"))]
    lines += ["## Answers (ACC / F1 / EM in %; RC: retrievals per question)", ""]
    lines += _md_scores(tables["main"], datasets, ANSWER_COLUMNS)
    if tables["retrieval"]:
        lines += ["", "## Retrieval (Recall / Full-Recall / mAP in %; documents read and steps per question)", ""]
        lines += _md_scores(tables["retrieval"], datasets, RETRIEVAL_COLUMNS)
    if tables.get("tree_retrieval"):
        lines += ["", f"## {TREE_TITLE}", ""]
        lines += _md_scores(tables["tree_retrieval"], datasets, TREE_COLUMNS)
        lines += ["", *(f"- {note}" for note in tables["tree_notes"])] if tables["tree_notes"] else []
    lines += categories_markdown(tables["categories"], datasets)
    views = [AVERAGE, *datasets] if len(datasets) > 1 else [AVERAGE]  # one dataset: its curve is the average
    for group in views:
        where = "average over datasets" if group == AVERAGE else group
        lines += ["", f"## {metric} vs max steps ({where}, %; columns: max steps)", ""]
        lines += _md_curves(tables["steps_curves"], "run", group)
    if tables["topk_curves"]:
        for group in views:
            where = "average over datasets" if group == AVERAGE else group
            lines += ["", f"## {metric} vs top-k ({where}, %; columns: documents per step)", ""]
            lines += _md_curves(tables["topk_curves"], "series", group)
    return "\n".join(lines) + "\n"


# -- HTML ------------------------------------------------------------------------------------------


def _e(value: Any) -> str:
    return html.escape(str(value))


def _y_scale(top_value: float) -> tuple[float, float]:
    """(axis top, tick step): round steps of 5, 10 or 20 points, at most six ticks above zero."""
    step = next(step for step in (0.05, 0.1, 0.2) if top_value <= 6 * step or step == 0.2)
    return max(step, math.ceil(top_value / step - 1e-9) * step), step


def _value_scale(low: float, high: float) -> tuple[float, float, float]:
    """(axis bottom, axis top, tick step) around [low, high] with 1-2-2.5-5 steps, about five ticks."""
    if 0 <= low < 0.5 * high:  # values well above zero: show zero for scale
        low = 0.0
    if high <= low:
        high = low + 1.0
    span = high - low
    magnitude = 10 ** math.floor(math.log10(span / 5))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if span / (m * magnitude) <= 6)
    return math.floor(low / step + 1e-9) * step, math.ceil(high / step - 1e-9) * step, step


def _tick(value: float, step: float) -> str:
    """A tick label with as many decimals as the step needs (2.5-steps one more)."""
    exponent = math.floor(math.log10(step) + 1e-9)
    decimals = max(0, -exponent) + (1 if round(step / 10**exponent, 1) == 2.5 else 0)
    return f"{value:.{decimals}f}"


def svg_chart(
    series: list[tuple[str, str, list[list[float]]]],
    x_label: str,
    y_label: str,
    percent: bool = True,
    markers: Sequence[tuple[float, str]] = (),
) -> str:
    """A line chart as inline SVG: axes, ticks and grid, one polyline with dots per (name, colour, points).

    ``percent``: values are shares in [0, 1] drawn in % from zero; otherwise the axis spans the values.
    ``markers``: (x, label) of dashed vertical lines, drawn where x lies within the curves' range.
    """
    width, height, left, top, plot_w, plot_h = 600, 300, 64, 14, 520, 242  # room for tick labels like 0.0125
    points = [(x, y) for _, _, values in series for x, y in values if y is not None]
    if not points:
        return '<p class="empty">No data for this plot.</p>'
    xs = sorted({x for x, _ in points})
    if percent:
        y_top, y_step = _y_scale(max(y for _, y in points))
        y_bottom, scale = 0.0, 100.0
    else:
        y_bottom, y_top, y_step = _value_scale(min(y for _, y in points), max(y for _, y in points))
        scale = 1.0
    x_min, x_span = xs[0], (xs[-1] - xs[0]) or 1
    y_span = (y_top - y_bottom) or 1.0

    def px(x: float) -> float:
        return left + 12 + (x - x_min) / x_span * (plot_w - 24)

    def py(y: float) -> float:
        return top + plot_h - (y - y_bottom) / y_span * plot_h

    bottom = top + plot_h
    parts = [f'<svg viewBox="0 0 {width} {height}" role="img" class="chart" aria-label="{_e(y_label)}">']
    for i in range(round(y_span / y_step) + 1):
        value = y_bottom + i * y_step
        y = py(value)
        label = f"{100 * value:.0f}" if percent else _tick(value, y_step)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    parts.append(f'<line x1="{left}" y1="{bottom}" x2="{left + plot_w}" y2="{bottom}" class="axis"/>')
    parts.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" class="axis"/>')
    every = max(1, math.ceil(len(xs) / 20))  # at most about 20 x labels
    for x in xs[::every]:
        parts.append(f'<line x1="{px(x):.1f}" y1="{bottom}" x2="{px(x):.1f}" y2="{bottom + 4}" class="axis"/>')
        parts.append(f'<text x="{px(x):.1f}" y="{bottom + 17}" text-anchor="middle">{x:g}</text>')
    parts.append(
        f'<text x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle" class="axis-label">{_e(x_label)}</text>'
        f'<text transform="translate(14 {top + plot_h / 2}) rotate(-90)" text-anchor="middle" class="axis-label">'
        f"{_e(y_label)}</text>"
    )
    for x, label in markers:
        if xs[0] <= x <= xs[-1]:
            parts.append(
                f'<line x1="{px(x):.1f}" y1="{top}" x2="{px(x):.1f}" y2="{bottom}" class="marker"/>'
                f'<text x="{px(x) + 4:.1f}" y="{top + 10}" class="marker-label">{_e(label)}</text>'
            )
    dots = max(len(values) for _, _, values in series) <= 60  # long curves (SFT steps): lines only
    for name, color, values in series:
        kept = [(x, y) for x, y in values if y is not None]
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in kept)
        parts.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"/>')
        if dots:
            parts += [
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{color}">'
                f"<title>{_e(name)}: {x:g} → {scale * y:.4g}</title></circle>"
                for x, y in kept
            ]
    parts.append("</svg>")
    return "".join(parts)


def _plot(element_id: str, title: str, curves: list[dict[str, Any]], name_key: str, x_label: str, metric: str) -> str:
    """A figure with one chart per view (the average first, then each dataset), a view <select> and a legend."""
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(curves))]
    views = list(curves[0]["points"])
    views.remove(AVERAGE)
    views.insert(0, AVERAGE)
    options, charts = [], []
    for view in views:
        options.append(
            f'<option value="{_e(view)}">{"average over datasets" if view == AVERAGE else _e(view)}</option>'
        )
        series = [(curve[name_key], color, curve["points"][view]) for curve, color in zip(curves, colors, strict=True)]
        hidden = "" if view == AVERAGE else " hidden"
        charts.append(
            f'<div class="view" data-view="{_e(view)}"{hidden}>{svg_chart(series, x_label, metric + " (%)")}</div>'
        )
    legend = "".join(
        f'<li><span class="swatch" style="background:{color}"></span>{_e(curve[name_key])}</li>'
        for curve, color in zip(curves, colors, strict=True)
    )
    return (
        f'<figure><figcaption>{_e(title)} <select id="{element_id}-view" aria-label="plot view">{"".join(options)}'
        f'</select></figcaption><div id="{element_id}" class="plot">{"".join(charts)}</div>'
        f'<ul class="legend">{legend}</ul></figure>'
    )


def _html_scores(element_id: str, rows: list[dict[str, Any]], datasets: list[str], columns: tuple) -> str:
    groups = [*datasets, AVERAGE]
    head = '<tr><th rowspan="2">run</th>' + "".join(f'<th colspan="{len(columns)}">{_e(g)}</th>' for g in groups)
    head += "</tr><tr>" + "".join(f"<th>{title}</th>" for _ in groups for _, title in columns) + "</tr>"
    body = "".join(
        f'<tr><td title="{_e(row["model"])} · {_e(row["name"])}">{_e(row["run"])}</td>'
        + "".join(f"<td>{cell}</td>" for cell in _cells(row, groups, columns))
        + "</tr>"
        for row in rows
    )
    return f'<table id="{element_id}"><thead>{head}</thead><tbody>{body}</tbody></table>'


def _html_runs(runs: list[dict[str, Any]]) -> str:
    keys = ("run", "name", "model", "engine", "topk", "max_steps", "question_docs", "judge", "questions")
    head = "".join(f"<th>{key.replace('_', ' ')}</th>" for key in keys)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e('–' if run[key] is None else run[key])}</td>" for key in keys) + "</tr>"
        for run in runs
    )
    return f'<table id="runs-table" class="runs"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _docs(documents: list[dict[str, Any]], gold: set[str]) -> list[dict[str, Any]]:
    passages = [Passage(str(doc.get("id", "?")), str(doc.get("contents", ""))) for doc in documents]
    return [{"id": p.id, "title": p.title, "text": p.text[:DOC_CHARS], "gold": p.id in gold} for p in passages]


def _steps(row: dict[str, Any]) -> list[dict[str, Any]]:
    gold = set(map(str, row.get("gold_ids") or ()))
    steps = []
    if row.get("question_documents"):  # env.question_docs: the environment searched the question first
        steps.append({"analysis": QUESTION_SEARCH, "query": row.get("question"), "answer": None,
                      "docs": _docs(row["question_documents"], gold)})  # fmt: skip
    for step in row.get("steps") or ():
        steps.append({
            "analysis": step.get("analysis") or "", "query": step.get("query"), "answer": step.get("answer"),
            "docs": _docs(step.get("documents") or [], gold),
        })  # fmt: skip
    return steps


def trajectories(run: Run, max_questions: int) -> tuple[list[dict[str, Any]], int]:
    """The browser's view of a run's first ``max_questions`` questions, and how many the run has."""
    predictions, question_scores = run.folder / "predictions.jsonl", run.folder / "question_scores.jsonl"
    if not predictions.exists():
        logger.warning("%s has no predictions.jsonl: its trajectories are left out of the page", run.folder)
        return [], 0
    scored = {row["id"]: row for _, row in iter_jsonl(question_scores)} if question_scores.exists() else {}
    rows = {row["id"]: row for _, row in iter_jsonl(predictions)}  # a resumed run's retried question: its last try
    items = []
    for row in list(rows.values())[:max_questions]:
        score = scored.get(row["id"], {})
        steps = _steps(row)
        items.append({
            "run": run.label, "id": row["id"], "dataset": row.get("dataset", "?"), "question": row.get("question", ""),
            "golden": row.get("golden_answers") or [], "answer": row.get("answer"),
            "prediction": row.get("prediction") or "", "steps": steps, "num_steps": row.get("num_steps", len(steps)),
            "invalid": row.get("invalid"), "correct": bool(score.get("correct")), "em": score.get("em"),
            "f1": score.get("f1"), "acc": score.get("acc"), "judge": score.get("judge"),
        })  # fmt: skip
    return items, len(rows)


def _embed(value: Any) -> str:
    """JSON for a <script> element: every '<' escaped, so no '</script>' or '<!--' in the data can end or bend it."""
    return json.dumps(value, ensure_ascii=False).replace("<", "\\u003c")


def _trajectory_section(runs: list[Run], max_questions_per_run: int) -> str:
    data, notes = [], []
    for run in runs:
        items, total = trajectories(run, max_questions_per_run)
        data += items
        if total > len(items):
            notes.append(f"{run.label}: the first {len(items):,} of {total:,} questions are shown (capped).")
    return (
        "<h2>Trajectories</h2>"
        + "".join(f'<p class="note capped">{_e(note)}</p>' for note in notes)
        + '<div class="filters">'
        '<label>run <select id="filter-run"></select></label>'
        '<label>dataset <select id="filter-dataset"></select></label>'
        '<label>verdict <select id="filter-verdict"><option value="all">all</option>'
        '<option value="correct">correct</option><option value="wrong">wrong</option></select></label>'
        '<label>steps <select id="filter-steps"></select></label>'
        '<label>search <input id="filter-text" type="search" placeholder="words in the question or answer"></label>'
        '<span id="trajectory-count"></span></div>'
        '<div id="trajectories"></div>'
        f'<script type="application/json" id="trajectory-data">{_embed(data)}</script>'
    )


def render_html(
    tables: dict[str, Any], runs: list[Run], max_questions_per_run: int = 2000, training: str = "", learned: str = ""
) -> str:
    """The self-contained page: what was learned, tables, answer categories, sweep plots, training, trajectories."""
    from eval.report_categories import categories_html

    datasets, metric = tables["datasets"], tables["metric"].upper()
    why = "every run was judged" if metric == "ACC" else "not every run was judged, so EM"
    sections = [
        "<h1>Evaluation report</h1>",
        f'<p class="note">{len(runs)} run(s) over {len(datasets)} dataset(s). Rates in %; ACC is the judge\'s '
        f"accuracy (– where a run had no judge). The plots show {metric} ({why}).</p>",
        learned,
        "<h2>Runs</h2>",
        _html_runs(tables["runs"]),
        "<h2>Answers: ACC / F1 / EM, and RC (retrievals per question)</h2>",
        _html_scores("main-table", tables["main"], datasets, ANSWER_COLUMNS),
    ]
    if tables["retrieval"]:
        sections += [
            "<h2>Retrieval: Recall / Full-Recall / mAP, documents read and steps per question</h2>",
            _html_scores("retrieval-table", tables["retrieval"], datasets, RETRIEVAL_COLUMNS),
        ]
    if tables.get("tree_retrieval"):
        sections += [
            f"<h2>{_e(TREE_TITLE)}</h2>",
            _html_scores("tree-retrieval-table", tables["tree_retrieval"], datasets, TREE_COLUMNS),
            *(f'<p class="note">{_e(note)}</p>' for note in tables["tree_notes"]),
        ]
    sections.append(categories_html(tables["categories"], datasets))
    sections.append('<h2>Sweeps</h2><div class="plots">')
    steps_plot = _plot("plot-steps", f"{metric} vs max steps", tables["steps_curves"], "run", "max steps", metric)
    sections.append(steps_plot)
    if tables["topk_curves"]:
        x_label = "documents per step (top-k)"
        sections.append(_plot("plot-topk", f"{metric} vs top-k", tables["topk_curves"], "series", x_label, metric))
    else:
        sections.append(
            f'<figure><figcaption>{metric} vs top-k</figcaption><p id="plot-topk" class="empty">'
            "No runs that differ only in top-k (see <code>r3rag eval sweep</code>).</p></figure>"
        )
    sections.append("</div>")
    sections.append(training)
    sections.append(_trajectory_section(runs, max_questions_per_run))
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1"><title>r3rag evaluation report</title>'
        f"<style>{PAGE_STYLE}</style></head><body>{''.join(sections)}<script>{PAGE_SCRIPT}</script></body></html>"
    )


def write_report(
    root: Path,
    out: Path | None = None,
    max_questions_per_run: int = 2000,
    training: str | Path | Sequence[str | Path] | None = None,
    baselines: Sequence[str] = (),
    learned: Sequence[str] = (),
) -> dict[str, Path]:
    """Write report.md, report.json and report.html for the scored runs under ``root`` into ``out`` (default root).

    ``training``: a ``r3rag train local`` run folder whose curves the report shows too, or several (SFT's run and
    an RL run of its own from its policy), their charts in that order. ``baselines``: the runs
    without retrieval that the answer categories pair the others with (default: found by model). ``learned``: run
    names (run.json's ``name``) in the order a policy went through them, e.g. untrained, sft, ppo: the page opens
    with one question answered by each (:mod:`eval.report_learned`).
    """
    from eval.report_learned import learned_example, learned_html
    from eval.report_training import training_charts, training_html, training_markdown

    runs = find_runs(root)
    out = out or root
    out.mkdir(parents=True, exist_ok=True)
    tables = build_tables(runs, root, baselines)
    folders = [training] if isinstance(training, str | Path) else list(training or [])
    charts = [chart for folder in folders for chart in training_charts(Path(folder))]
    if charts:
        tables["training"] = charts
    items = [
        {**item, "run": run.info["name"]}
        for run in runs
        if run.info.get("name") in learned
        for item in trajectories(run, max_questions_per_run)[0]
    ]
    example = learned_example(items, learned)
    if example:
        tables["learned"] = example
    paths = {"md": out / "report.md", "json": out / "report.json", "html": out / "report.html"}
    paths["md"].write_text(render_markdown(tables) + "\n".join(training_markdown(charts)) + ("\n" if charts else ""))
    paths["json"].write_text(json.dumps(tables, indent=2) + "\n")
    paths["html"].write_text(
        render_html(tables, runs, max_questions_per_run, training_html(charts), learned_html(example))
    )
    logger.info("report over %d runs: %s", len(runs), ", ".join(str(p) for p in paths.values()))
    return paths
