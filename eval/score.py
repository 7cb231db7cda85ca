"""``r3rag eval score``: metrics of a run, per dataset and per step cutoff.

Reads ``predictions.jsonl`` and writes

- ``scores.json``: per dataset and on average (the unweighted mean over datasets, the paper's
  Average), for every step cutoff: ACC, EM, F1, sub-EM, the answered share, average steps,
  retrievals and documents read, and (for datasets naming gold passages) Recall, Full-Recall
  and mAP (see :mod:`eval.metrics`);
- ``question_scores.jsonl``: each question's scores at the run's own step limit, with the judge's
  verdict, for the report's trajectory browser;
- ``judgements.jsonl``, append-only: the judge's verdict per question and answer, so rescoring
  (other cutoffs, a report) never asks the judge twice.

ACC is the reward server's ``/correctness`` (string match first, then the judge, as in training);
without ``judge.url`` it is left empty rather than replaced by string match.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from eval.metrics import aggregate, average, matched_k, question_metrics, step_limit
from eval.run import PREDICTIONS, RUNS_LOG, read_manifest
from r3_env.answers import judged_correct
from r3_env.batching import Coalescer
from r3_env.config import positive_ints
from r3_env.data import JsonlWriter, iter_jsonl, write_jsonl
from r3_env.reward_client import AsyncRewardClient, RewardServiceError, check_answer
from r3_env.runs import JobCounts, JudgeClientConfig, run_jobs

logger = logging.getLogger(__name__)

JUDGEMENTS = "judgements.jsonl"


@dataclass(frozen=True)
class ScoreConfig:
    run: str = field(default="", metadata={"help": "run folder written by r3rag eval run"})
    cutoffs: str = field(default="", metadata={"help": "step cutoffs, comma-separated (default: 1 to env.max_steps)"})

    def __post_init__(self) -> None:
        if not self.run:
            raise ValueError("run is required: the folder an `r3rag eval run --out` wrote")
        self.cutoff_list(1)

    def cutoff_list(self, max_steps: int) -> list[int]:
        return positive_ints(self.cutoffs, "cutoffs") if self.cutoffs else list(range(1, max_steps + 1))


SECTIONS = [("", ScoreConfig), ("judge.", JudgeClientConfig)]


def read_predictions(run: Path) -> list[dict[str, Any]]:
    path = run / PREDICTIONS
    if not path.exists():
        raise ValueError(f"{run} has no {PREDICTIONS}; run `r3rag eval run --out {run}` first")
    rows: dict[str, dict[str, Any]] = {}
    for _, row in iter_jsonl(path):
        rows[row["id"]] = row
    return list(rows.values())


def _judge_key(row: dict[str, Any]) -> str:
    return json.dumps([row["id"], row["answer"]])


async def judge_identity(url: str, cached: list[dict[str, Any]]) -> str:
    """The judge the reward server runs, as its /health names it.

    When the server does not answer, the judge of the cached verdicts (if they have one), so a
    rescoring that needs no new verdict works offline; else the URL.
    """
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            health = (await client.get(url.rstrip("/") + "/health")).json()
        return str(health.get("judge") or url)
    except (httpx.HTTPError, ValueError, AttributeError):
        names = {entry.get("judge") for entry in cached}
        return str(names.pop()) if len(names) == 1 else url


async def judge_answers(
    rows: list[dict[str, Any]], judge: JudgeClientConfig, run: Path
) -> tuple[dict[str, dict[str, Any]], str, int]:
    """(verdict per answered question, the judge's name, how many verdicts are fallbacks).

    Verdicts come from ``judgements.jsonl`` when that judge gave them, else the judge is asked.
    A fallback (the judge failed and the server answered for it) counts as wrong here but is
    never cached, so the next scoring asks again.
    """
    path = run / JUDGEMENTS
    cached = [entry for _, entry in iter_jsonl(path)] if path.exists() else []
    name = await judge_identity(judge.url, cached)
    known = {_judge_key(entry): entry for entry in cached if entry.get("judge") == name}
    todo = [row for row in rows if row.get("answer") is not None and _judge_key(row) not in known]
    if todo:
        client = AsyncRewardClient(judge.url, timeout=judge.timeout_s, retries=judge.retries)
        batcher = Coalescer(lambda items: client.correctness(items), 64, 0.005, "correctness", RewardServiceError)
        bar = tqdm(total=len(todo), desc="judging", unit=" answers", mininterval=1.0)

        async def ask(row: dict[str, Any]) -> Any:
            return await check_answer(row["question"], row["answer"], row["golden_answers"], batcher.submit)

        def finish(row: dict[str, Any], verdict: Any) -> None:
            entry = {"id": row["id"], "answer": row["answer"], "judge": name, "score": verdict.score}
            entry.update(method=verdict.method, fallback=verdict.fallback)
            if not verdict.fallback:
                writer.write(entry)
            known[_judge_key(row)] = entry

        try:
            with JsonlWriter(path) as writer:  # a judge failing for good stops the others and is raised
                await run_jobs(todo, ask, finish, (), JobCounts(), 256, 1, lambda row: row["id"], bar)
        finally:
            await client.aclose()
    verdicts = {row["id"]: known[_judge_key(row)] for row in rows if row.get("answer") is not None}
    return verdicts, name, sum(bool(entry["fallback"]) for entry in verdicts.values())


def _missing_row(dataset: str, index: int) -> dict[str, Any]:
    """A question the run was asked but has no row for: no answer, no steps (so: wrong)."""
    return {"id": f"{dataset}/<missing {index}>", "dataset": dataset, "answer": None, "prediction": "",
            "golden_answers": [], "gold_ids": [], "steps": [], "num_steps": 0, "missing": True}  # fmt: skip


def score_rows(
    rows: list[dict[str, Any]],
    cutoffs: list[int],
    verdicts: dict[str, dict[str, Any]] | None,
    retrieves: bool = True,
    asked: dict[str, int] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the scores.json body, the per-question scores at the last cutoff).

    A method that retrieves nothing (direct CoT) gets no retrieval metrics rather than zeros.
    ``asked``: questions per dataset the run was given; those without a row (they failed, or the
    run has not finished) count as wrong, and each dataset says how many there were.
    """
    by_dataset: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_dataset[row["dataset"]].append(row)
    missing = {name: max(0, count - len(by_dataset[name])) for name, count in (asked or {}).items()}
    for name, count in missing.items():
        by_dataset[name] += [_missing_row(name, i) for i in range(count)]
    final = cutoffs[-1]
    datasets: dict[str, Any] = {}
    per_question: list[dict[str, Any]] = []
    for name in sorted(by_dataset):
        group = by_dataset[name]
        cells = {}
        for cutoff in cutoffs:
            metrics = []
            for row in group:
                verdict = None
                if verdicts is not None:
                    entry = verdicts.get(row["id"])
                    verdict = float(entry is not None and judged_correct(entry["score"]))
                metric = question_metrics(row, cutoff, verdict)
                if not retrieves:
                    metric["retrieval"] = None
                metrics.append(metric)
                if cutoff == final and not row.get("missing"):
                    per_question.append(_question_row(row, metric, verdicts))
            cells[str(cutoff)] = aggregate(metrics)
        datasets[name] = {
            "questions": len(group),
            "missing": missing.get(name, 0),
            "by_cutoff": cells,
            "final": cells[str(final)],
        }
    by_cutoff = {str(c): average([d["by_cutoff"][str(c)] for d in datasets.values()]) for c in cutoffs}
    body = {
        "cutoffs": cutoffs,
        "datasets": datasets,
        "average": {"by_cutoff": by_cutoff, "final": by_cutoff[str(final)]},
    }
    return body, per_question


def _question_row(row: dict[str, Any], metric: dict[str, Any], verdicts: dict | None) -> dict[str, Any]:
    entry = (verdicts or {}).get(row["id"])
    retrieval = metric["retrieval"] or {}
    return {
        "id": row["id"],
        "dataset": row["dataset"],
        "em": metric["em"],
        "f1": metric["f1"],
        "sub_em": metric["sub_em"],
        "acc": metric["acc"],
        "judge": {k: entry[k] for k in ("score", "method", "fallback")} if entry else None,
        "correct": bool(metric["acc"] if metric["acc"] is not None else metric["em"]),
        "recall": retrieval.get("recall"),
        "full_recall": retrieval.get("full_recall"),
        "ap": retrieval.get("ap"),
    }


async def score_run(config: ScoreConfig, judge: JudgeClientConfig) -> dict[str, Any]:
    """Score ``config.run``; writes scores.json and question_scores.jsonl and returns the scores."""
    run = Path(config.run)
    info = read_manifest(run)
    rows = read_predictions(run)
    if not rows:
        raise ValueError(f"{run / PREDICTIONS} is empty; let `r3rag eval run` finish at least one question")
    max_steps = step_limit(info)
    cutoffs = config.cutoff_list(max_steps)
    if cutoffs[-1] > max_steps:
        raise ValueError(f"cutoffs go up to {cutoffs[-1]} but the run allowed {max_steps} steps; rerun with more steps")
    verdicts, name, fallbacks = await judge_answers(rows, judge, run) if judge.url else (None, None, 0)
    if fallbacks:
        logger.warning("%d verdicts are the judge's fallbacks (counted wrong, not cached): rescore to retry", fallbacks)
    log = run / RUNS_LOG
    starts = [entry["questions"] for _, entry in iter_jsonl(log) if "questions" in entry] if log.exists() else []
    asked = starts[-1] if starts else None
    body, per_question = score_rows(rows, cutoffs, verdicts, info.get("retriever") != "none", asked)
    lost = sum(data["missing"] for data in body["datasets"].values())
    if lost:
        logger.warning("%d questions have no row (failed or not run yet): counted wrong; rerun the run to fill", lost)
    scores = {"run": info, "judge": name, "judge_fallbacks": fallbacks, **body}
    partial = run / "scores.json.tmp"  # written whole, then renamed: a kill never leaves half a file
    partial.write_text(json.dumps(scores, indent=2) + "\n")
    partial.replace(run / "scores.json")
    write_jsonl(run / "question_scores.jsonl", per_question)
    return scores


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _tree_lines(scores: dict[str, Any]) -> list[str]:
    """Retrieval-only runs (rrt, single_shot): @K, iterations and seconds per question; for rrt, the
    single-shot runs that match its @K."""
    lines = [f"  {'retrieval per question':<26}{'@K':>7}{'iterations':>12}{'retrieval s':>13}{'generation s':>14}"]
    named = [*scores["datasets"].items(), ("average", {"final": scores["average"]["final"]})]
    for name, data in named:
        m = data["final"]
        lines.append(f"  {name:<26}{m['avg_docs']:>7.2f}{m['iterations']:>12.2f}{m['retrieval_s']:>13.3f}"
                     f"{m['generation_s']:>14.3f}")  # fmt: skip
    if scores["run"].get("method") == "rrt":
        matched = ", ".join(f"{name} {matched_k(d['final']['avg_docs'])}" for name, d in scores["datasets"].items())
        lines.append(f"  single-shot retrieval at matched @K (--naive_topk per dataset): {matched}; "
                     "r3rag eval run --method single_shot --naive_topk K --data DATASET")  # fmt: skip
    return lines


def format_scores(scores: dict[str, Any]) -> str:
    run = scores["run"]
    lines = [
        f"{run['name']}: {run['method']} ({run['retriever']}), {run['model']}, judge: {scores['judge'] or 'none'}",
        f"  {'dataset':<20}{'n':>6}{'ACC':>7}{'EM':>7}{'F1':>7}{'RC':>6}{'answered':>10}{'steps':>7}{'docs':>7}"
        f"{'recall':>8}{'full':>7}{'mAP':>7}",
    ]
    answers = run.get("answers", True) is not False  # single_shot retrieves only: no answer metrics
    named = [*scores["datasets"].items(), ("average", {"questions": "", "final": scores["average"]["final"]})]
    for name, data in named:
        m = data["final"]
        acc, em, f1, answered = (_pct(m[key]) if answers else "-" for key in ("acc", "em", "f1", "answered"))
        lines.append(
            f"  {name:<20}{data['questions']!s:>6}{acc:>7}{em:>7}{f1:>7}"
            f"{m['avg_retrievals']:>6.2f}{answered:>10}{m['avg_steps']:>7.2f}{m['avg_docs']:>7.1f}"
            f"{_pct(m['recall']):>8}{_pct(m['full_recall']):>7}{_pct(m['map']):>7}"
        )
    if scores["average"]["final"].get("retrieval_s") is not None:
        lines += _tree_lines(scores)
    lost = sum(data.get("missing", 0) for data in scores["datasets"].values())
    if lost:
        lines.append(f"  {lost} questions have no row yet and count as wrong: rerun `r3rag eval run` to fill them")
    if scores.get("judge_fallbacks"):
        lines.append(f"  {scores['judge_fallbacks']} verdicts were the judge's fallbacks (counted wrong): rescore")
    if not answers:
        return "\n".join(lines)
    curve = scores["average"]["by_cutoff"]
    metric = "acc" if scores["judge"] else "em"
    points = ", ".join(f"{c}: {_pct(curve[str(c)][metric])}" for c in scores["cutoffs"])
    lines.append(f"  {metric.upper()} by max steps (average): {points}")
    return "\n".join(lines)
