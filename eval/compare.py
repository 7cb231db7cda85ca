"""Two policies on the same questions: per-question scores of an evaluation run and the paired bootstrap CI
of a difference in means. ``r3rag demo``'s summary and ``bench/rl_gain.py`` compare their policies with it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def paired_bootstrap(
    arm: Sequence[float], base: Sequence[float], resamples: int = 2000, seed: int = 0
) -> dict[str, float]:
    """The mean of ``arm - base`` over paired questions and its bootstrap 95% CI (percentiles of the mean
    difference over ``resamples`` resamples of the questions, with replacement, from a fixed seed)."""
    return seeded_paired_bootstrap([arm], [base], resamples, seed)


def seeded_paired_bootstrap(
    arm: Sequence[Sequence[float]], base: Sequence[Sequence[float]], resamples: int = 2000, seed: int = 0
) -> dict[str, float]:
    """``paired_bootstrap`` of two arms trained at several seeds: ``arm[s][q]`` is seed ``s``'s score on
    question ``q`` (the same questions in every seed of both arms).

    Each resample draws the questions (paired: the same draw for both arms) and, independently, each arm's
    seeds, all with replacement, so the CI carries the spread between training runs as well as between
    questions. An arm with one seed is held fixed, and with one seed each this is the question bootstrap.
    Three seeds make a coarse draw: the seed part of the interval is then about 2-3 times narrower than a
    t-interval over the runs, so read the CI as the least uncertainty there is."""
    import numpy as np

    runs = {name: np.asarray(value, dtype=float) for name, value in (("arm", arm), ("base", base))}
    for name, scores in runs.items():
        if scores.ndim != 2 or not len(scores):
            raise ValueError(f"{name}: give one list of per-question scores per seed, not shape {scores.shape}")
    questions = runs["arm"].shape[1]
    if runs["base"].shape[1] != questions:
        raise ValueError(f"paired samples differ in length: {questions} and {runs['base'].shape[1]}")
    if not questions:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, questions, size=(resamples, questions))
    means = {}
    for name, scores in runs.items():
        per_seed = scores[:, picks].mean(axis=2).T  # (resamples, seeds): each seed's mean over the drawn questions
        seeds = rng.integers(0, len(scores), size=per_seed.shape)
        means[name] = np.take_along_axis(per_seed, seeds, axis=1).mean(axis=1)
    mean = float(runs["arm"].mean() - runs["base"].mean())
    lo, hi = (float(v) for v in np.percentile(means["arm"] - means["base"], [2.5, 97.5]))
    # the percentiles of a constant are that constant up to rounding: keep lo <= mean <= hi exact
    return {"mean": mean, "lo": min(lo, mean), "hi": max(hi, mean), "n": questions}


def question_key(dataset: str, question_id: str) -> str:
    return f"{dataset}/{question_id}"


def question_set(data: str, max_questions: int) -> dict[str, dict[str, str]]:
    """The compared questions (the first ``max_questions`` of each dataset, 0: all): key -> dataset, type and
    answer form (:func:`r3_env.answers.answer_form`)."""
    from r3_env.answers import answer_form
    from r3_env.runs import dataset_paths, load_questions

    return {
        question_key(q.dataset, q.item.id): {
            "dataset": q.dataset,
            "type": str(q.item.metadata.get("type") or "-"),
            "form": answer_form(q.item.question, q.item.golden_answers),
        }
        for q in load_questions(dataset_paths(data), max_questions)
    }


def question_scores(run: Path, questions: dict[str, dict[str, str]]) -> dict[str, dict[str, Any]]:
    """Each asked question's metrics in an evaluation run at its step limit; a question with no row (it failed)
    counts as unanswered and wrong, with no documents."""
    from eval.metrics import question_metrics, step_limit
    from eval.run import read_manifest
    from eval.score import read_predictions

    manifest = read_manifest(run)
    limit = step_limit(manifest)
    answers = manifest.get("method") != "single_shot"  # retrieval only: no answer to score
    scores = {}
    for row in read_predictions(run):
        key = question_key(row["dataset"], row["question_id"])
        if key not in questions:
            continue
        metric = question_metrics(row, limit, None)
        retrieval = metric["retrieval"] or {}
        scores[key] = {
            "em": metric["em"] if answers else None,
            "f1": metric["f1"] if answers else None,
            "full_recall": retrieval.get("full_recall"),
            "docs": float(metric["docs"]),
            "answered": metric["answered"] if answers else None,
            "format_error": float("invalid" in row) if answers else None,
        }
    missing = [key for key in questions if key not in scores]
    if missing:
        logger.warning("%s: %d of %d questions have no row (failed): counted wrong", run, len(missing), len(questions))
    for key in missing:
        scores[key] = {"em": 0.0, "f1": 0.0, "full_recall": 0.0, "docs": 0.0, "answered": 0.0, "format_error": 0.0}
        if not answers:
            scores[key].update(em=None, f1=None, answered=None, format_error=None)
    return scores


def compare_runs(
    arm: Path, base: Path, questions: dict[str, dict[str, str]], metric: str = "em", resamples: int = 2000
) -> dict[str, float]:
    """``arm``'s run minus ``base``'s on ``metric`` over ``questions``, with its paired bootstrap 95% CI."""
    arm_scores, base_scores = question_scores(arm, questions), question_scores(base, questions)
    keys = sorted(questions)
    return paired_bootstrap(
        [arm_scores[key][metric] or 0.0 for key in keys], [base_scores[key][metric] or 0.0 for key in keys], resamples
    )
