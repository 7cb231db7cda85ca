"""The report's training section: curves from a ``r3rag train local`` run's ``metrics.jsonl``.

PPO curves are per iteration: mean episode reward, outcome shares, the dev-set reward (greedy
episodes, ``ppo.eval_prompts``), losses, steps and documents per episode, what searching paid (the
shares of episodes that searched and that found a gold passage their start lacked, and the mean
reward with and without a search), and where each iteration's time went. SFT's loss is per optimizer step.

The Health group (:mod:`r3_env.train.health`) charts the signs of a policy going wrong: the shares
of unanswered episodes and format errors, of blank, repeated and copied queries, the retrievals per
episode (RC), the KL to the reference and the entropy, with the monitor's warnings from
``ppo/health.jsonl`` below them and the best policy's iteration and dev reward from
``ppo/best_policy/best.json``.

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
from r3_env.train.health import DRIFTS, SHARES, SPIKES, read_warnings
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
    ("ppo", "Dev-set reward (greedy episodes)", "reward", [("dev_reward", "dev reward")], False),
    ("ppo", "Losses", "loss", [("value_loss", "value loss"), ("policy_loss", "policy loss")], False),
    (
        "ppo",
        "Steps and documents per episode",
        "per episode",
        [("steps", "steps"), ("docs_read", "documents read")],
        False,
    ),
    # RL learns to search only from episodes where searching paid: when searches seldom find a gold passage the
    # start lacked, the reward cannot pay for them and the share that searches falls
    (
        "ppo",
        "Episodes that searched, and whose searches found a gold passage their start lacked",
        "episodes (%)",
        [("searched", "searched"), ("found_gold", "found gold")],
        True,
    ),
    (
        "ppo",
        "Mean reward of the episodes that searched and of those that did not",
        "reward",
        [("reward_searched", "searched"), ("reward_not_searched", "did not search")],
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
            ("dev_s", "dev evaluation (after it)"),
        ],
        False,
    ),
    ("sft", "SFT loss", "loss per token", [("loss", "loss")], False),
]
# The Health group: the signs r3_env.train.health watches (same shape as CHARTS)
HEALTH_CHARTS: list[tuple[str, str, str, list[tuple[str, str]], bool]] = [
    (
        "ppo",
        "Unanswered episodes and format errors",
        "episodes (%)",
        [("no_answer", "no answer"), ("format_error", "format error")],
        True,
    ),
    (
        "ppo",
        "Blank, repeated and copied queries",
        "queries (%)",
        [
            ("blank_queries", "blank"),
            ("repeated_queries", "repeats an earlier one"),
            ("copied_queries", "copies the question"),
        ],
        True,
    ),
    ("ppo", "Retrievals per episode (RC)", "RC", [("retrievals", "RC")], False),
    ("ppo", "KL to the reference policy", "KL", [("kl", "KL")], False),
    ("ppo", "Policy entropy", "nats per token", [("entropy", "entropy")], False),
]
SIGNS = {**SHARES, **DRIFTS, **SPIKES}
BEST_FILE = "ppo/best_policy/best.json"  # r3_env.train.ppo.BEST_FILE in the PPO folder
HEALTH_FILE = "ppo/health.jsonl"
MAX_WARNING_ROWS = 40
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


def best_policy(run: Path) -> dict[str, Any] | None:
    """``ppo/best_policy/best.json``: the iteration and dev reward of the policy kept there (None: no best policy)."""
    path = Path(run) / BEST_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def training_charts(run: Path) -> list[dict[str, Any]]:
    """The charts' data (JSON-ready): title, stage, group (training or health), axis labels, one point list per
    series, the stage switch. A health chart carries the monitor's ``warnings`` on its metrics; the dev reward's
    chart the ``best`` policy kept (``{"iteration", "dev_reward"}``) and a marker at its iteration."""
    rows = read_metrics(Path(run))
    switch = stage_switch(run)
    warnings = read_warnings(Path(run) / HEALTH_FILE)
    best = best_policy(run)
    charts = []
    for group, specs in (("training", CHARTS), ("health", HEALTH_CHARTS)):
        for stage, title, y_label, metrics, percent in specs:
            stage_rows = [row for row in rows if row["stage"] == stage]
            series = {
                name: [[row["step"], row[key]] for row in stage_rows if row.get(key) is not None]
                for key, name in metrics
            }
            if not any(series.values()):
                continue
            chart = {
                "title": title,
                "stage": stage,
                "group": group,
                "x_label": X_LABELS[stage],
                "y_label": y_label,
                "percent": percent,
                "series": series,
                "markers": [switch_marker(switch)] if stage == "ppo" and switch is not None else [],
            }
            if group == "health":
                keys = {key for key, _ in metrics}
                chart["warnings"] = [w for w in warnings if w["metric"] in keys]
            if "dev_reward" in dict(metrics) and best is not None:
                chart["best"] = best
                chart["markers"] = [*chart["markers"], {"x": best["iteration"], "label": "best policy"}]
            charts.append(chart)
    return charts


def _warnings(charts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((w for chart in charts for w in chart.get("warnings", [])), key=lambda w: (w["iteration"], w["sign"]))


def _best(charts: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((chart["best"] for chart in charts if chart.get("best")), None)


def _stage_markers(charts: list[dict[str, Any]]) -> list[int]:
    """The first stage-2 iteration of each chart with the stage switch marked."""
    return [m["first"] for chart in charts for m in chart["markers"][:1] if "first" in m]


def _warning_cells(warning: dict[str, Any]) -> list[str]:
    percent = warning["metric"] in SHARES
    value, baseline, threshold = (
        f"{100 * warning[k]:.1f}%" if percent else f"{warning[k]:.4g}" for k in ("value", "baseline", "threshold")
    )
    return [str(warning["iteration"]), warning["sign"], SIGNS.get(warning["metric"], warning["metric"]), value,
            baseline, threshold]  # fmt: skip


WARNING_HEADER = ["iteration", "sign", "what", "value", "baseline", "threshold"]


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
    health = [chart for chart in charts if chart.get("group") == "health"]
    warnings, best = _warnings(charts), _best(charts)
    if best is not None:
        lines += [
            "",
            f"Best policy (ppo/best_policy): PPO iteration {best['iteration']}, dev reward {best['dev_reward']:.4g}.",
        ]
    if health:
        lines += ["", "### Health warnings", ""]
        if not warnings:
            lines.append("No warnings: no share rose, retrievals per episode held, neither KL nor entropy spiked.")
        else:
            lines += ["| " + " | ".join(WARNING_HEADER) + " |", "|---" * len(WARNING_HEADER) + "|"]
            lines += ["| " + " | ".join(_warning_cells(w)) + " |" for w in warnings[:MAX_WARNING_ROWS]]
            if len(warnings) > MAX_WARNING_ROWS:
                lines += ["", f"... and {len(warnings) - MAX_WARNING_ROWS} more in ppo/health.jsonl."]
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

    def figure(chart: dict[str, Any]) -> str:
        named = list(chart["series"].items())
        colors = [PALETTE[i % len(PALETTE)] for i in range(len(named))]
        series = [(name, color, points) for (name, points), color in zip(named, colors, strict=True)]
        legend = "".join(
            f'<li><span class="swatch" style="background:{color}"></span>{html.escape(name)}</li>'
            for (name, _), color in zip(named, colors, strict=True)
        )
        markers = [(marker["x"], marker["label"]) for marker in chart["markers"]]
        svg = svg_chart(series, chart["x_label"], chart["y_label"], percent=chart["percent"], markers=markers)
        return (
            f'<figure class="training"><figcaption>{html.escape(chart["title"])}</figcaption>{svg}'
            f'<ul class="legend">{legend}</ul></figure>'
        )

    marked = _stage_markers(charts)
    note = (
        f'<p class="note" id="stage-switch">Dashed line: stage 2 of the reward starts at PPO iteration {marked[0]} '
        "(stage 1 rewards retrieving when the answer is wrong; stage 2 charges each retrieval when it is right).</p>"
        if marked
        else ""
    )
    best = _best(charts)
    if best is not None:
        note += (
            f'<p class="note" id="best-policy">Best policy (<code>ppo/best_policy</code>, by greedy dev reward): '
            f"PPO iteration {best['iteration']}, dev reward {best['dev_reward']:.4g}.</p>"
        )
    training = [figure(chart) for chart in charts if chart.get("group", "training") == "training"]
    page = f'<h2>Training</h2>{note}<div class="plots" id="training-plots">' + "".join(training) + "</div>"
    health = [chart for chart in charts if chart.get("group") == "health"]
    if health:
        page += '<h3>Health</h3><div class="plots" id="health-plots">' + "".join(map(figure, health)) + "</div>"
        page += _warnings_html(_warnings(charts))
    return page


def _warnings_html(warnings: list[dict[str, Any]]) -> str:
    if not warnings:
        return (
            '<p class="note" id="health-warnings">No health warnings: no share rose, retrievals per episode held, '
            "no KL or entropy spike.</p>"
        )
    head = "".join(f"<th>{html.escape(name)}</th>" for name in WARNING_HEADER)
    left = ' style="text-align:left"'  # the sign and what it watches are words

    def row(cells: list[str]) -> str:
        return "".join(f"<td{left if i in (1, 2) else ''}>{html.escape(c)}</td>" for i, c in enumerate(cells))

    body = "".join(f"<tr>{row(_warning_cells(w))}</tr>" for w in warnings[:MAX_WARNING_ROWS])
    more = len(warnings) - MAX_WARNING_ROWS
    rest = f'<p class="note">... and {more} more in <code>ppo/health.jsonl</code>.</p>' if more > 0 else ""
    return (
        f'<p class="note">Health warnings ({len(warnings)}):</p>'
        f'<table id="health-warnings"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{rest}'
    )
