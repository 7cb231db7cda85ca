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

Retrieval-only records (``rrt``, ``single_shot``: rows with a ``retrieval`` block) are read by
iteration instead: their steps are retrievals tagged with the ``depth`` (iteration) that made them,
the reader reads every document retrieved, so at cutoff ``c`` the documents of iterations up to
``c`` count, and "docs" is @K, the distinct documents retrieved. Their answer (rrt's reader) comes
after the last iteration (``num_steps`` is the tree's iterations). They also give the iterations and
the retrieval and generation seconds per question (the whole expansion's, at every cutoff).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from r3_env.answers import exact_match, f1_score, sub_exact_match
from r3_env.retrieval.metrics import retrieval_metrics as ranked_list_metrics

ANSWER_METRICS = ("em", "f1", "sub_em")
TREE_METRICS = ("iterations", "retrieval_s", "generation_s")  # per question, of retrieval-only records


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
    scores = ranked_list_metrics(ranked, gold_ids)
    if scores is not None:
        scores["ap"] = scores.pop("average_precision")
    return scores


def answered_within(row: dict[str, Any], cutoff: int) -> bool:
    """Whether the trajectory's answer came within its first ``cutoff`` steps."""
    return row.get("answer") is not None and row["num_steps"] <= cutoff


def steps_within(row: dict[str, Any], cutoff: int) -> list[dict[str, Any]]:
    return row.get("steps", [])[:cutoff]


def documents_read(row: dict[str, Any], cutoff: int) -> list[dict[str, Any]]:
    """The retrievals whose documents the policy saw within ``cutoff`` steps, each with its ``documents``.

    The question's own retrieval (``question_documents``, ``env.question_docs``) is read first, with the
    question. Step i's documents are read when another step follows within the cutoff: a query that ends
    the trajectory, or that is the cutoff's last step, retrieved documents nobody read (with
    ``max_steps`` = cutoff the episode would have ended there).
    """
    last = min(cutoff, row["num_steps"])
    with_question = [{"documents": row["question_documents"]}] if row.get("question_documents") else []
    return with_question + [step for step in row.get("steps", [])[: last - 1] if "query" in step]


def question_metrics(row: dict[str, Any], cutoff: int, verdict: float | None) -> dict[str, Any]:
    """One question's metrics at ``cutoff``; ``verdict`` is the judge's 0/1 for its final answer (None: unjudged)."""
    answered = answered_within(row, cutoff)
    scores = answer_scores(row.get("prediction") or "", row["golden_answers"]) if answered else None
    metrics: dict[str, Any] = scores or dict.fromkeys(ANSWER_METRICS, 0.0)
    metrics["acc"] = None if verdict is None else (verdict if answered else 0.0)
    metrics["answered"] = float(answered)
    metrics["steps"] = min(row["num_steps"], cutoff)
    tree = row.get("retrieval")
    if tree is not None:  # rrt / single_shot: every document retrieved within the cutoff's iterations is read
        read = [step for step in row.get("steps", []) if "query" in step and step.get("depth", 1) <= cutoff]
        ranked = ranked_documents(read)
        metrics["retrievals"] = len(read)
        metrics["docs"] = len(ranked)
        metrics["retrieval"] = retrieval_scores(ranked, row.get("gold_ids") or ())
        metrics["iterations"] = min(float(tree["iterations"]), cutoff)
        metrics["retrieval_s"], metrics["generation_s"] = float(tree["retrieval_s"]), float(tree["generation_s"])
        return metrics
    steps = steps_within(row, cutoff)
    read = documents_read(row, cutoff)
    metrics["retrievals"] = sum(1 for step in steps if "query" in step)
    metrics["docs"] = sum(len(step.get("documents") or ()) for step in read)
    metrics["retrieval"] = retrieval_scores(ranked_documents(read), row.get("gold_ids") or ())
    metrics["iterations"] = metrics["retrieval_s"] = metrics["generation_s"] = None
    return metrics


def matched_k(documents: float) -> int:
    """The single-shot top-k matching a run's documents retrieved per question (@K): @K rounded half up, at least 1."""
    return max(1, int(documents + 0.5))


def step_limit(manifest: dict[str, Any]) -> int:
    """The most steps a row of a run may take (its last step cutoff): the tree's iterations for rrt, else
    ``env.max_steps``, plus the answer step the environment starts after the last retrieval with
    ``env.answer_at_limit``."""
    tree = manifest.get("tree")
    if tree:
        return int(tree["max_iterations"])
    env = manifest["env"]
    return int(env["max_steps"]) + (1 if env.get("answer_at_limit") else 0)


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
        # retrieval-only records (rrt, single_shot): None for the others
        **{key: _mean([m[key] for m in per_question if m.get(key) is not None]) for key in TREE_METRICS},
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
