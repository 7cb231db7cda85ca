"""The report's training section: curves from a ``r3rag train local`` run's ``metrics.jsonl``.

PPO curves are per iteration: mean episode reward, outcome shares, KL to the reference and
entropy, losses, steps and documents per episode, and where each iteration's time went. SFT's
loss is per optimizer step.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from r3_env.train.metrics import read_metrics

# (stage, title, y label, [(metric, series name)], values are shares drawn in %)
CHARTS: list[tuple[str, str, str, list[tuple[str, str]], bool]] = [
    ("ppo", "Mean episode reward", "reward", [("reward", "reward")], False),
    (
        "ppo",
        "Episode outcomes",
        "episodes (%)",
        [("correct", "correct"), ("wrong", "wrong"), ("no_answer", "no answer"), ("format_error", "format error")],
        True,
    ),
    ("ppo", "KL to the reference policy", "KL", [("kl", "KL")], False),
    ("ppo", "Policy entropy", "nats per token", [("entropy", "entropy")], False),
    ("ppo", "Losses", "loss", [("value_loss", "value loss"), ("policy_loss", "policy loss")], False),
    (
        "ppo",
        "Steps and documents per episode",
        "per episode",
        [("steps", "steps"), ("retrievals", "retrievals"), ("docs_read", "documents read")],
        False,
    ),
    (
        "ppo",
        "Where an iteration's time goes",
        "seconds",
        [
            ("generation_s", "generation"),
            ("retrieval_s", "retrieval"),
            ("judging_s", "judging"),
            ("training_s", "training"),
        ],
        False,
    ),
    ("sft", "SFT loss", "loss per token", [("loss", "loss")], False),
]
X_LABELS = {"ppo": "PPO iteration", "sft": "SFT step"}


def training_charts(run: Path) -> list[dict[str, Any]]:
    """The charts' data (JSON-ready): title, stage, axis labels and one point list per series."""
    rows = read_metrics(Path(run))
    charts = []
    for stage, title, y_label, metrics, percent in CHARTS:
        stage_rows = [row for row in rows if row["stage"] == stage]
        series = {
            name: [[row["step"], row[key]] for row in stage_rows if row.get(key) is not None] for key, name in metrics
        }
        if any(series.values()):
            charts.append(
                {
                    "title": title,
                    "stage": stage,
                    "x_label": X_LABELS[stage],
                    "y_label": y_label,
                    "percent": percent,
                    "series": series,
                }
            )
    return charts


def training_markdown(charts: list[dict[str, Any]]) -> list[str]:
    """First and last value of every curve."""
    if not charts:
        return []
    lines = ["", "## Training (first → last)", "", "| curve | series | first | last |", "|---|---|---|---|"]
    for chart in charts:
        for name, points in chart["series"].items():
            if points:
                scale = 100 if chart["percent"] else 1
                lines.append(
                    f"| {chart['title']} | {name} | {scale * points[0][1]:.4g} | {scale * points[-1][1]:.4g} |"
                )
    return lines


def training_html(charts: list[dict[str, Any]]) -> str:
    from eval.report import PALETTE, svg_chart

    if not charts:
        return ""
    figures = []
    for chart in charts:
        named = list(chart["series"].items())
        colors = [PALETTE[i % len(PALETTE)] for i in range(len(named))]
        series = [(name, color, points) for (name, points), color in zip(named, colors, strict=True)]
        legend = "".join(
            f'<li><span class="swatch" style="background:{color}"></span>{html.escape(name)}</li>'
            for (name, _), color in zip(named, colors, strict=True)
        )
        svg = svg_chart(series, chart["x_label"], chart["y_label"], percent=chart["percent"])
        figures.append(
            f'<figure class="training"><figcaption>{html.escape(chart["title"])}</figcaption>{svg}'
            f'<ul class="legend">{legend}</ul></figure>'
        )
    return '<h2>Training</h2><div class="plots" id="training-plots">' + "".join(figures) + "</div>"
