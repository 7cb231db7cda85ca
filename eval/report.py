"""``r3rag eval report DIR``: every scored run under DIR as tables, sweep plots and a trajectory browser.

- ``report.md`` / ``report.json``: the paper's layout (rows: method and retriever; columns:
  datasets x ACC/F1/EM, then the Average), a retrieval table, and the two sweep curves as data;
- ``report.html``: one self-contained page (no network): the tables, accuracy vs max steps (each
  run's step cutoffs) and accuracy vs top-k (runs that differ only in ``env.topk``) as inline SVG,
  and a trajectory browser filtered by run, dataset, verdict and step count, with gold documents
  marked. Every text from a dataset or a model is escaped; the browser sets ``textContent`` only.

Accuracy in the curves is ACC when every run was judged, else EM (the page says which).
"""

from __future__ import annotations

import html
import json
import logging
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.report_page import PAGE_SCRIPT, PAGE_STYLE
from r3_env.data import Passage, iter_jsonl

logger = logging.getLogger(__name__)

ANSWER_COLUMNS = (("acc", "ACC"), ("f1", "F1"), ("em", "EM"))
RETRIEVAL_COLUMNS = (("recall", "Recall"), ("full_recall", "Full-Recall"), ("map", "mAP"), ("avg_docs", "docs"))
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")


@dataclass
class Run:
    folder: Path
    scores: dict[str, Any]

    @property
    def info(self) -> dict[str, Any]:
        return self.scores["run"]

    @property
    def label(self) -> str:
        return f"{self.info.get('method', '?')} ({self.info.get('retriever', '?')})"

    @property
    def topk(self) -> int | None:
        return (self.info.get("env") or {}).get("topk")


def find_runs(root: Path) -> list[Run]:
    """Scored runs under ``root`` (``root`` itself may be one); unscored ones are skipped with a warning."""
    if not root.is_dir():
        raise ValueError(f"{root} is not a folder of evaluation runs")
    runs = []
    for manifest in sorted(root.rglob("run.json")):
        folder = manifest.parent
        scores = folder / "scores.json"
        if not scores.exists():
            logger.warning("%s has no scores.json (run `r3rag eval score --run %s`); left out", folder, folder)
            continue
        runs.append(Run(folder, json.loads(scores.read_text())))
    if not runs:
        raise ValueError(f"no scored run under {root}: run `r3rag eval score --run RUN` for each run first")
    labels = [run.label for run in runs]
    for run in runs:  # several runs of one method and retriever: tell them apart by their names
        if labels.count(run.label) > 1:
            run_name = run.info.get("name") or run.folder.name
            run.scores["run"] = {**run.info, "label": f"{run.label} {run_name}"}
    return runs


def _label(run: Run) -> str:
    return run.info.get("label") or run.label


def curve_metric(runs: list[Run]) -> str:
    return "acc" if all(run.scores.get("judge") for run in runs) else "em"


def build_tables(runs: list[Run]) -> dict[str, Any]:
    """The report's content as data (report.json)."""
    datasets = sorted({name for run in runs for name in run.scores["datasets"]})
    metric = curve_metric(runs)
    main, retrieval = [], []
    for run in runs:
        cells = {name: run.scores["datasets"][name]["final"] for name in datasets if name in run.scores["datasets"]}
        cells["average"] = run.scores["average"]["final"]
        common = {"run": _label(run), "name": run.info.get("name"), "method": run.info.get("method"),
                  "retriever": run.info.get("retriever"), "model": run.info.get("model"), "topk": run.topk}  # fmt: skip
        main.append({**common, **{f"{d}.{key}": c.get(key) for d, c in cells.items() for key, _ in ANSWER_COLUMNS}})
        if any(cell.get("recall") is not None for cell in cells.values()):
            retrieval.append(
                {**common, **{f"{d}.{key}": c.get(key) for d, c in cells.items() for key, _ in RETRIEVAL_COLUMNS}}
            )
    steps_curves = [
        {"run": _label(run), "points": [[int(c), run.scores["average"]["by_cutoff"][str(c)][metric]]
                                        for c in run.scores["cutoffs"]],
         "by_dataset": {name: [[int(c), data["by_cutoff"][str(c)][metric]] for c in run.scores["cutoffs"]]
                        for name, data in run.scores["datasets"].items()}}
        for run in runs
    ]  # fmt: skip
    return {
        "metric": metric,
        "datasets": datasets,
        "main": main,
        "retrieval": retrieval,
        "steps_curves": steps_curves,
        "topk_curves": topk_curves(runs, metric),
    }


def topk_curves(runs: list[Run], metric: str) -> list[dict[str, Any]]:
    """Runs alike in all but ``env.topk`` (method, retriever, model, other episode rules): one curve each group."""
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        env = {k: v for k, v in (run.info.get("env") or {}).items() if k != "topk"}
        key = json.dumps(
            [run.info.get("method"), run.info.get("retriever"), run.info.get("model"), env], sort_keys=True
        )
        groups[key].append(run)
    curves = []
    for group in groups.values():
        if len({run.topk for run in group}) < 2:
            continue
        group.sort(key=lambda run: run.topk or 0)
        first = group[0]
        curves.append({
            "series": f"{first.info.get('method')} ({first.info.get('retriever')})",
            "points": [[run.topk, run.scores["average"]["final"][metric]] for run in group],
            "by_dataset": {name: [[run.topk, run.scores["datasets"][name]["final"][metric]] for run in group
                                  if name in run.scores["datasets"]] for name in first.scores["datasets"]},
        })  # fmt: skip
    return curves


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def _cell(key: str, value: float | None) -> str:
    return ("–" if value is None else f"{value:.1f}") if key == "avg_docs" else _pct(value)


def _markdown_table(rows: list[dict], datasets: list[str], columns: tuple) -> list[str]:
    groups = [*datasets, "average"]
    header = "| run | " + " | ".join(f"{d} {title}" for d in groups for _, title in columns) + " |"
    lines = [header, "|" + "---|" * (1 + len(groups) * len(columns))]
    for row in rows:
        cells = [_cell(key, row.get(f"{d}.{key}")) for d in groups for key, _ in columns]
        lines.append(f"| {row['run']} | " + " | ".join(cells) + " |")
    return lines


def render_markdown(tables: dict[str, Any]) -> str:
    datasets, metric = tables["datasets"], tables["metric"].upper()
    lines = ["# Evaluation report", "", "## Answers (ACC / F1 / EM, %)", ""]
    lines += _markdown_table(tables["main"], datasets, ANSWER_COLUMNS)
    if tables["retrieval"]:
        lines += ["", "## Retrieval (Recall / Full-Recall / mAP in %, documents read)", ""]
        lines += _markdown_table(tables["retrieval"], datasets, RETRIEVAL_COLUMNS)
    lines += ["", f"## {metric} vs max steps (average over datasets, %)", ""]
    cutoffs = sorted({x for curve in tables["steps_curves"] for x, _ in curve["points"]})
    lines += ["| run | " + " | ".join(map(str, cutoffs)) + " |", "|" + "---|" * (1 + len(cutoffs))]
    for curve in tables["steps_curves"]:
        points = dict(curve["points"])
        lines.append(f"| {curve['run']} | " + " | ".join(_pct(points.get(c)) for c in cutoffs) + " |")
    if tables["topk_curves"]:
        lines += ["", f"## {metric} vs top-k (average over datasets, %)", ""]
        for curve in tables["topk_curves"]:
            points = ", ".join(f"k={k}: {_pct(v)}" for k, v in curve["points"])
            lines.append(f"- {curve['series']}: {points}")
    return "\n".join(lines) + "\n"


# -- HTML ------------------------------------------------------------------------------------------


def svg_chart(element_id: str, series: list[tuple[str, list[list[float]]]], x_label: str, y_label: str) -> str:
    """A line chart as inline SVG: axes with ticks, one polyline and dots per series, a legend."""
    width, height, left, right, top, bottom = 560, 300, 52, 150, 16, 44
    points = [(x, y) for _, values in series for x, y in values if y is not None]
    if not points:
        return f'<p id="{element_id}" class="empty">No data for this plot.</p>'
    xs = sorted({x for x, _ in points})
    y_top = max(0.05, max(y for _, y in points))
    y_top = min(1.0, (int(y_top * 10) + 1) / 10)
    x_min, x_max = xs[0], xs[-1] if xs[-1] != xs[0] else xs[0] + 1
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + (x - x_min) / (x_max - x_min) * plot_w

    def py(y: float) -> float:
        return top + plot_h - y / y_top * plot_h

    parts = [f'<svg id="{element_id}" viewBox="0 0 {width} {height}" role="img" class="chart">']
    parts.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" class="axis"/>')
    parts.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" class="axis"/>')
    for i in range(6):
        value = y_top * i / 5
        y = py(value)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{100 * value:.0f}</text>')
    for x in xs:
        parts.append(f'<text x="{px(x):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{x:g}</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle">{html.escape(x_label)}</text>')
    parts.append(
        f'<text transform="translate(14 {top + plot_h / 2}) rotate(-90)" text-anchor="middle">'
        f"{html.escape(y_label)}</text>"
    )
    for index, (name, values) in enumerate(series):
        color = PALETTE[index % len(PALETTE)]
        kept = [(x, y) for x, y in values if y is not None]
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in kept)
        parts.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in kept:
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"><title>'
                         f"{html.escape(name)}: {x:g} → {100 * y:.1f}</title></circle>")  # fmt: skip
        legend_y = top + 14 + 18 * index
        parts.append(f'<rect x="{left + plot_w + 12}" y="{legend_y - 9}" width="12" height="3" fill="{color}"/>')
        parts.append(f'<text x="{left + plot_w + 30}" y="{legend_y - 4}">{html.escape(name[:22])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _html_table(element_id: str, rows: list[dict], datasets: list[str], columns: tuple) -> str:
    groups = [*datasets, "average"]
    head = "<tr><th rowspan=2>run</th>" + "".join(f'<th colspan="{len(columns)}">{html.escape(d)}</th>' for d in groups)
    head += "</tr><tr>" + "".join(f"<th>{title}</th>" for _ in groups for _, title in columns) + "</tr>"
    body = "".join(
        f"<tr><td>{html.escape(row['run'])}</td>"
        + "".join(f"<td>{_cell(key, row.get(f'{d}.{key}'))}</td>" for d in groups for key, _ in columns)
        + "</tr>"
        for row in rows
    )
    return f'<table id="{element_id}"><thead>{head}</thead><tbody>{body}</tbody></table>'


def trajectories(run: Run, max_questions: int) -> tuple[list[dict[str, Any]], int]:
    """The browser's view of a run's questions (at most ``max_questions``) and how many it has."""
    scored = {}
    path = run.folder / "question_scores.jsonl"
    if path.exists():
        scored = {row["id"]: row for _, row in iter_jsonl(path)}
    items, total = [], 0
    for _, row in iter_jsonl(run.folder / "predictions.jsonl"):
        total += 1
        if len(items) >= max_questions:
            continue
        gold = set(map(str, row.get("gold_ids") or ()))
        score = scored.get(row["id"], {})
        steps = []
        for step in row.get("steps", []):
            documents = [Passage(str(d["id"]), d["contents"]) for d in step.get("documents") or ()]
            steps.append({
                "analysis": step.get("analysis", ""), "query": step.get("query"), "answer": step.get("answer"),
                "docs": [{"id": p.id, "title": p.title, "text": p.text[:1500], "gold": p.id in gold}
                         for p in documents],
            })  # fmt: skip
        items.append({
            "run": _label(run), "id": row["id"], "dataset": row["dataset"], "question": row["question"],
            "golden": row.get("golden_answers", []), "answer": row.get("answer"), "prediction": row.get("prediction"),
            "steps": steps, "num_steps": row.get("num_steps", len(steps)), "invalid": row.get("invalid"),
            "correct": bool(score.get("correct")), "em": score.get("em"), "f1": score.get("f1"),
            "judge": score.get("judge"),
        })  # fmt: skip
    return items, total


def _embed(value: Any) -> str:
    """JSON safe inside a <script> element: with every '<' escaped, no '</script>' or '<!--' can end or bend it."""
    return json.dumps(value, ensure_ascii=False).replace("<", "\\u003c")


def render_html(tables: dict[str, Any], runs: list[Run], max_questions_per_run: int) -> str:
    datasets, metric = tables["datasets"], tables["metric"].upper()
    data, notes = [], []
    for run in runs:
        items, total = trajectories(run, max_questions_per_run)
        data += items
        if total > len(items):
            notes.append(f"{_label(run)}: showing the first {len(items):,} of {total:,} questions")
    steps_series = [(curve["run"], curve["points"]) for curve in tables["steps_curves"]]
    topk_series = [(curve["series"], curve["points"]) for curve in tables["topk_curves"]]
    sections = [
        "<h1>Evaluation report</h1>",
        f"<p class=note>{len(runs)} run(s); accuracy in the plots is {metric}"
        f"{' (the LLM judge)' if metric == 'ACC' else ' (not every run was judged)'}; rates in %.</p>",
        "<h2>Answers: ACC / F1 / EM</h2>",
        _html_table("main-table", tables["main"], datasets, ANSWER_COLUMNS),
    ]
    if tables["retrieval"]:
        sections += [
            "<h2>Retrieval: Recall / Full-Recall / mAP, documents read</h2>",
            _html_table("retrieval-table", tables["retrieval"], datasets, RETRIEVAL_COLUMNS),
        ]
    sections += [
        '<div class="plots"><figure><figcaption>' + f"{metric} vs max steps (average over datasets)</figcaption>",
        svg_chart("plot-steps", steps_series, "max steps", f"{metric} (%)"),
        "</figure><figure><figcaption>" + f"{metric} vs top-k (average over datasets)</figcaption>",
        svg_chart("plot-topk", topk_series, "documents per step (top-k)", f"{metric} (%)")
        if topk_series
        else '<p id="plot-topk" class="empty">No runs that differ only in top-k (see r3rag eval sweep).</p>',
        "</figure></div>",
        "<h2>Trajectories</h2>",
        "".join(f"<p class=note>{html.escape(note)}</p>" for note in notes),
        '<div class="filters">'
        '<label>run <select id="filter-run"></select></label>'
        '<label>dataset <select id="filter-dataset"></select></label>'
        '<label>verdict <select id="filter-verdict"><option value="all">all</option>'
        '<option value="correct">correct</option><option value="wrong">wrong</option></select></label>'
        '<label>steps <select id="filter-steps"></select></label>'
        '<label>search <input id="filter-text" type="search" placeholder="words in the question"></label>'
        '<span id="trajectory-count"></span></div>',
        '<div id="trajectories"></div>',
        f'<script type="application/json" id="trajectory-data">{_embed(data)}</script>',
    ]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>r3rag evaluation report</title>'
        f"<style>{PAGE_STYLE}</style></head><body>{''.join(sections)}<script>{PAGE_SCRIPT}</script></body></html>"
    )


def write_report(root: Path, out: Path | None = None, max_questions_per_run: int = 2000) -> dict[str, Path]:
    """Write report.md, report.json and report.html for the scored runs under ``root`` into ``out`` (default root)."""
    runs = find_runs(root)
    out = out or root
    out.mkdir(parents=True, exist_ok=True)
    tables = build_tables(runs)
    paths = {"md": out / "report.md", "json": out / "report.json", "html": out / "report.html"}
    paths["md"].write_text(render_markdown(tables))
    paths["json"].write_text(json.dumps(tables, indent=2) + "\n")
    paths["html"].write_text(render_html(tables, runs, max_questions_per_run))
    logger.info("report over %d runs: %s", len(runs), ", ".join(str(p) for p in paths.values()))
    return paths
