"""The report's training section: curves from a ``r3rag train local`` run's ``metrics.jsonl``.

PPO curves are per iteration: mean episode reward, outcome shares, retrievals per episode (RC),
KL to the reference and entropy, losses, steps and documents per episode, and where each
iteration's time went. SFT's loss is per optimizer step.

A staged reward (``lws``, "Learning when to search") switches to
stage 2 at ``reward.options.switch_step``: the PPO charts mark the switch, so RC's rise in stage
1 and fall in stage 2 show against it.
"""

from __future__ import annotations

import html
import json
import logging
from pathlib import Path
from typing import Any

from r3_env.rewards import get_scheme
from r3_env.train.metrics import read_metrics

logger = logging.getLogger(__name__)

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
    ("ppo", "Retrievals per episode (RC)", "RC", [("retrievals", "RC")], False),
    (
        "ppo",
        "Steps and documents per episode",
        "per episode",
        [("steps", "steps"), ("docs_read", "documents read")],
        False,
    ),
    (
        "ppo",
        "Where an iteration's time goes",
        "seconds",
        [
            ("sync_s", "weight sync (vLLM)"),
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
CONFIG_FILE = "config.json"  # r3_env.train.local.CONFIG_FILE (importing that module loads torch)


def stage_switch(run: Path) -> int | None:
    """The training step at which the run's reward scheme changes stage (None: it has no stages to mark)."""
    path = Path(run) / CONFIG_FILE
    reward = (json.loads(path.read_text()).get("reward") or {}) if path.is_file() else {}
    if not reward.get("scheme"):
        return None
    try:
        scheme = get_scheme(reward["scheme"], **(reward.get("options") or {}))
    except ValueError as error:  # a scheme or an option this version does not have
        logger.warning("%s: %s; no stage switch is marked", run, error)
        return None
    return scheme.stage_switch or None  # 0: stage 2 from the start, nothing to mark


def switch_marker(switch: int) -> dict[str, Any]:
    """Where the PPO charts draw the switch. The trainer's clock is the iterations done, so the iteration logged as
    ``s`` ran at training step ``s - 1``: iteration ``switch`` is stage 1's last, and the line stands after it."""
    return {"x": switch + 0.5, "label": "stage 2", "first": switch + 1}


def training_charts(run: Path) -> list[dict[str, Any]]:
    """The charts' data (JSON-ready): title, stage, axis labels, one point list per series, the stage switch."""
    rows = read_metrics(Path(run))
    switch = stage_switch(run)
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
                    "markers": [switch_marker(switch)] if stage == "ppo" and switch is not None else [],
                }
            )
    return charts


def training_markdown(charts: list[dict[str, Any]]) -> list[str]:
    """First and last value of every curve; RC at the stage switch when the reward has one."""
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
    rc = next((chart for chart in charts if chart["markers"] and chart["series"].get("RC")), None)
    if rc is not None:
        first = rc["markers"][0]["first"]
        value = dict(rc["series"]["RC"]).get(first - 1)
        where = "not reached" if value is None else f"RC {value:.4g} at iteration {first - 1}, the last of stage 1"
        lines += ["", f"Stage 2 of the reward starts at PPO iteration {first} ({where})."]
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
        markers = [(marker["x"], marker["label"]) for marker in chart["markers"]]
        svg = svg_chart(series, chart["x_label"], chart["y_label"], percent=chart["percent"], markers=markers)
        figures.append(
            f'<figure class="training"><figcaption>{html.escape(chart["title"])}</figcaption>{svg}'
            f'<ul class="legend">{legend}</ul></figure>'
        )
    marked = [chart["markers"][0]["first"] for chart in charts if chart["markers"]]
    note = (
        f'<p class="note" id="stage-switch">Dashed line: stage 2 of the reward starts at PPO iteration {marked[0]} '
        "(stage 1 rewards retrieving when the answer is wrong; stage 2 charges each retrieval when it is right).</p>"
        if marked
        else ""
    )
    return f'<h2>Training</h2>{note}<div class="plots" id="training-plots">' + "".join(figures) + "</div>"
