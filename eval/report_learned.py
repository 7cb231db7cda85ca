"""The report's first panel: one question, the same question for each policy in turn, side by side.

A table of rates says that a policy improved; one question answered by the untrained, the SFT and
the RL policy shows what it learned: which queries it writes, which documents they find (gold
marked), and the answer. The question is chosen from the rows the runs share: the last policy
right where the first is wrong, then the most gold documents found by the last, then the first
such question in the file, so the same scores always pick the same question.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

DOC_SHOWN = 160  # characters of each document's text in the panel


def pick_example(by_run: dict[str, dict[str, dict[str, Any]]], order: Sequence[str]) -> str | None:
    """The question id to show: shared by every run in ``order``, where the last run gained the most."""
    present = [name for name in order if name in by_run]
    if len(present) < 2:
        return None
    shared = [qid for qid in by_run[present[-1]] if all(qid in by_run[name] for name in present)]

    def gold_found(item: dict[str, Any]) -> int:
        return sum(doc["gold"] for step in item["steps"] for doc in step["docs"])

    def gain(qid: str) -> tuple:
        first, last = by_run[present[0]][qid], by_run[present[-1]][qid]
        return (last["correct"] and not first["correct"], last["correct"], gold_found(last))

    return max(shared, key=gain) if shared else None


def learned_example(items: Sequence[dict[str, Any]], order: Sequence[str]) -> dict[str, Any] | None:
    """``{"question", "golden", "columns": [{"run", "steps", "prediction", "correct"}]}`` or None.

    ``items`` are the trajectory browser's rows (:func:`eval.report.trajectories`), whose ``run`` is
    the run's name; ``order`` names the runs left to right (e.g. untrained, sft, ppo).
    """
    by_run: dict[str, dict[str, dict[str, Any]]] = {}
    for item in items:  # ids are unique within a dataset only (FlashRAG's dev_0, ...)
        by_run.setdefault(item["run"], {})[f"{item['dataset']}/{item['id']}"] = item
    qid = pick_example(by_run, order)
    if qid is None:
        return None
    columns = [by_run[name][qid] for name in order if name in by_run]
    first = columns[0]
    return {"question": first["question"], "golden": first["golden"], "columns": columns}


def _e(value: Any) -> str:
    return html.escape(str(value))


def _step_html(step: dict[str, Any]) -> str:
    if step.get("answer") is not None:
        return f'<li class="answer-step">answers <b>{_e(step["answer"])}</b></li>'
    docs = "".join(
        f'<li class="{"doc gold" if doc["gold"] else "doc"}">'
        + ('<span class="gold-mark">★ gold</span>' if doc["gold"] else "")
        + f"<b>{_e(doc['title'])}</b> {_e(doc['text'][:DOC_SHOWN])}</li>"
        for doc in step["docs"]
    )
    query = step.get("query") or "(several queries)"  # a multi_query step keeps its queries in the record only
    return f'<li><span class="query">query: {_e(query)}</span><ul class="docs">{docs}</ul></li>'


def learned_html(example: dict[str, Any] | None) -> str:
    if example is None:
        return ""
    columns = []
    for column in example["columns"]:
        verdict = "correct" if column["correct"] else "wrong"
        steps = "".join(_step_html(step) for step in column["steps"]) or "<li>no step parsed</li>"
        columns.append(
            f'<div class="learned-column"><h3>{_e(column["run"])} <span class="verdict {verdict}">{verdict}</span></h3>'
            f'<ol class="learned-steps">{steps}</ol>'
            f'<p class="learned-answer">final answer: <b>{_e(column["prediction"] or "(none)")}</b></p></div>'
        )
    return (
        '<section id="learned"><h2>What was learned</h2>'
        f'<p class="learned-question"><b>{_e(example["question"])}</b> '
        f"(golden: {_e(' | '.join(example['golden']))})</p>"
        f'<div class="learned-grid">{"".join(columns)}</div></section>'
    )


def learned_markdown(example: dict[str, Any] | None) -> list[str]:
    if example is None:
        return []
    lines = ["## What was learned", "", f"**{example['question']}** (golden: {' | '.join(example['golden'])})", ""]
    for column in example["columns"]:
        lines.append(f"- **{column['run']}** ({'correct' if column['correct'] else 'wrong'}):")
        for step in column["steps"]:
            if step.get("answer") is not None:
                lines.append(f"  - answers {step['answer']}")
                continue
            found = ", ".join(f"{doc['title']}{' (gold)' if doc['gold'] else ''}" for doc in step["docs"])
            lines.append(f"  - query: {step.get('query') or '(several queries)'} -> {found or 'no documents'}")
        lines.append(f"  - final answer: {column['prediction'] or '(none)'}")
    return [*lines, ""]
