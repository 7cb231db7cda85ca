"""Per-question metrics and their aggregation, per dataset and per step cutoff.

Answer metrics are FlashRAG's (:mod:`r3_env.answers`: EM, F1 and sub-EM after SQuAD
normalisation). Retrieval metrics need the dataset's gold passage ids: the documents a question
read (shown to the policy: a last query that ran out of steps was never shown), in retrieval
order with repeats dropped, are one ranked list, and

- Recall: the share of gold passages in it; Full-Recall: 1 when all of them are;
- AP: the mean over gold passages of precision at the rank where each was found (0 if never).

A step cutoff ``c`` keeps a trajectory's first ``c`` steps: an answer in a later step does not
count (no answer within the cutoff is wrong), and only documents read within those steps count.
One run with ``max_steps`` 10 therefore gives the whole accuracy-vs-max-steps curve.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from r3_env.answers import exact_match, f1_score, sub_exact_match

ANSWER_METRICS = ("em", "f1", "sub_em")
RETRIEVAL_METRICS = ("recall", "full_recall", "map")


def answer_scores(prediction: str, golden_answers: Sequence[str]) -> dict[str, float]:
    """EM, F1 and sub-EM of one short answer, each the best over the golden answers (FlashRAG's)."""
    if not prediction:
        return dict.fromkeys(ANSWER_METRICS, 0.0)
    return {
        "em": exact_match(prediction, golden_answers),
        "f1": f1_score(prediction, golden_answers),
        "sub_em": sub_exact_match(prediction, golden_answers),
    }


def ranked_documents(steps: Iterable[dict[str, Any]]) -> list[str]:
    """Document ids in the order the steps retrieved them, first occurrence only."""
    seen: dict[str, None] = {}
    for step in steps:
        for document in step.get("documents") or ():
            seen.setdefault(str(document["id"]), None)
    return list(seen)


def retrieval_scores(ranked: Sequence[str], gold_ids: Sequence[str]) -> dict[str, float] | None:
    """Recall, Full-Recall and AP of one ranked list (None when the question names no gold passage)."""
    gold = set(map(str, gold_ids))
    if not gold:
        return None
    hits, precision_sum = 0, 0.0
    for rank, doc_id in enumerate(ranked, start=1):
        if doc_id in gold:
            hits += 1
            precision_sum += hits / rank
    return {"recall": hits / len(gold), "full_recall": float(hits == len(gold)), "ap": precision_sum / len(gold)}


def answered_within(row: dict[str, Any], cutoff: int) -> bool:
    """Whether the trajectory's answer came within its first ``cutoff`` steps."""
    return row.get("answer") is not None and row["num_steps"] <= cutoff


def steps_within(row: dict[str, Any], cutoff: int) -> list[dict[str, Any]]:
    return row.get("steps", [])[:cutoff]


def documents_read(row: dict[str, Any], cutoff: int) -> list[dict[str, Any]]:
    """The query steps whose documents the policy saw within ``cutoff`` steps.

    Step i's documents are read when another step follows within the cutoff: a query that ends
    the trajectory, or that is the cutoff's last step, retrieved documents nobody read (with
    ``max_steps`` = cutoff the episode would have ended there).
    """
    last = min(cutoff, row["num_steps"])
    return [step for step in row.get("steps", [])[: last - 1] if "query" in step]


def question_metrics(row: dict[str, Any], cutoff: int, verdict: float | None) -> dict[str, Any]:
    """One question's metrics at ``cutoff``; ``verdict`` is the judge's 0/1 for its final answer (None: unjudged)."""
    answered = answered_within(row, cutoff)
    scores = answer_scores(row.get("prediction") or "", row["golden_answers"]) if answered else None
    metrics: dict[str, Any] = scores or dict.fromkeys(ANSWER_METRICS, 0.0)
    metrics["acc"] = None if verdict is None else (verdict if answered else 0.0)
    metrics["answered"] = float(answered)
    steps = steps_within(row, cutoff)
    read = documents_read(row, cutoff)
    metrics["steps"] = min(row["num_steps"], cutoff)
    metrics["retrievals"] = sum(1 for step in steps if "query" in step)
    metrics["docs"] = sum(len(step.get("documents") or ()) for step in read)
    metrics["retrieval"] = retrieval_scores(ranked_documents(read), row.get("gold_ids") or ())
    return metrics


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def aggregate(per_question: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over questions, in the shape of a report cell (rates as fractions)."""
    retrieval = [m["retrieval"] for m in per_question if m["retrieval"] is not None]
    judged = [m["acc"] for m in per_question if m["acc"] is not None]
    summary: dict[str, Any] = {
        "acc": _mean(judged) if len(judged) == len(per_question) and judged else None,
        **{name: _mean([m[name] for m in per_question]) or 0.0 for name in ANSWER_METRICS},
        "answered": _mean([m["answered"] for m in per_question]) or 0.0,
        "avg_steps": _mean([m["steps"] for m in per_question]) or 0.0,
        "avg_retrievals": _mean([m["retrievals"] for m in per_question]) or 0.0,
        "avg_docs": _mean([m["docs"] for m in per_question]) or 0.0,
        "recall": _mean([r["recall"] for r in retrieval]),
        "full_recall": _mean([r["full_recall"] for r in retrieval]),
        "map": _mean([r["ap"] for r in retrieval]),
        "gold_questions": len(retrieval),
    }
    return summary


def average(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The unweighted mean of datasets' cells (the paper's Average column); None stays None if any is None."""
    keys = [key for key in cells[0] if key != "gold_questions"]
    result: dict[str, Any] = {}
    for key in keys:
        values = [cell[key] for cell in cells]
        result[key] = None if any(v is None for v in values) else sum(values) / len(values)
    result["gold_questions"] = sum(cell["gold_questions"] for cell in cells)
    return result
