"""Retrieval quality of one ranked list against a question's gold passages: one formula for every caller.

Evaluation (``eval.metrics``), the retrieval tree (:func:`r3_env.tree.tree_metrics`) and R2AG's
Top-t/x AP reward (:func:`r3_env.rewards.top_t_average_precision`) all read these.
"""

from __future__ import annotations

from collections.abc import Sequence


def average_precision(hits: Sequence[bool], gold_total: int) -> float:
    """(1/|g|) * sum over ranks u of precision@u * 1{result u is gold}; 0 when there is no gold."""
    found, total = 0, 0.0
    for rank, gold in enumerate(hits, start=1):
        if gold:
            found += 1
            total += found / rank
    return total / gold_total if gold_total else 0.0


QUALITY_KEYS = ("recall", "full_recall", "average_precision")


def retrieval_quality(retrieved_ids: Sequence[str], gold_ids: Sequence[str]) -> dict[str, float]:
    """:func:`retrieval_metrics`, with zeros for a question without gold (tables that count every question)."""
    return retrieval_metrics(retrieved_ids, gold_ids) or dict.fromkeys(QUALITY_KEYS, 0.0)


def retrieval_metrics(retrieved_ids: Sequence[str], gold_ids: Sequence[str]) -> dict[str, float] | None:
    """Recall, Full-Recall and AP of ``retrieved_ids`` in rank order (None when there is no gold passage)."""
    gold = set(map(str, gold_ids))
    if not gold:
        return None
    hits = [doc in gold for doc in retrieved_ids]
    found = len(gold & set(retrieved_ids))
    return {
        "recall": found / len(gold),
        "full_recall": float(found == len(gold)),
        "average_precision": average_precision(hits, len(gold)),
    }
