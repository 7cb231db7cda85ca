"""Correctness (string match first, the judge only when it fails) and whole-transcript R3 rewards.

``score_transcripts`` is what OpenRLHF's remote reward protocol calls: it splits each transcript
into steps with the policy's chat template (``r3_env.protocol``), judges every retrieval step's
documents and the final answer in two batched judge calls, and combines them with a reward
scheme (``r3_env.rewards``). The outcome and the scheme's Episode are made as the rollout makes
them (``r3_env.episode``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from r3_env.answers import judged_correct, settled_by_string
from r3_env.data import read_label
from r3_env.episode import SCORED_OUTCOMES, Outcome, Trace, build_episode, classify
from r3_env.protocol import ChatRenderer, FormatError, Step
from r3_env.rewards import RewardScheme
from reward_server.judges.base import CorrectnessItem, Judge, JudgeResult, RelevanceItem
from reward_server.metrics import RewardMetrics

logger = logging.getLogger(__name__)


async def _nothing() -> list:
    return []


@dataclass(frozen=True)
class Verdict:
    correct: bool
    method: str  # "match", "judge", "fallback" (judge failed) or "empty" (no prediction)
    judge: JudgeResult | None = None

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"correct": self.correct, "score": float(self.correct), "method": self.method}
        if self.judge is not None:
            row.update(
                backend=self.judge.backend,
                fallback=self.judge.fallback,
                reason=self.judge.reason,
                analysis=self.judge.analysis,
                cached=self.judge.cached,
            )
        return row


async def correctness(judge: Judge, items: Sequence[CorrectnessItem], metrics: RewardMetrics) -> list[Verdict]:
    """String match (whole normalised words) first; the judge only for the items that fail it."""
    verdicts: list[Verdict | None] = []
    ask: list[tuple[int, CorrectnessItem]] = []
    for index, item in enumerate(items):
        prediction, settled = settled_by_string(item.prediction, item.golden_answers)
        if settled:
            metrics.match_answers.inc()
        if settled is not None:
            verdicts.append(Verdict(settled, "match" if settled else "empty"))
        else:
            verdicts.append(None)
            ask.append((index, CorrectnessItem(item.question, prediction, item.golden_answers)))
    judged = await judge.correctness([item for _, item in ask]) if ask else []
    for (index, _), result in zip(ask, judged, strict=True):
        verdicts[index] = Verdict(judged_correct(result.score), "fallback" if result.fallback else "judge", result)
    return verdicts  # type: ignore[return-value]


@dataclass
class ParsedTranscript:
    """One transcript read back into steps: what /get_reward needs to build an Episode."""

    question: str
    golden_answers: list[str]
    steps: list[Step] = field(default_factory=list)
    documents: list[list[str]] = field(default_factory=list)  # per retrieval step
    format_error: str | None = None
    problem: str | None = None  # why the transcript could not be read: it gets a neutral reward of 0

    @property
    def answer(self) -> str | None:
        return self.steps[-1].answer if self.steps and self.steps[-1].is_final else None

    def trace(self) -> Trace:
        return Trace(self.question, self.golden_answers, self.steps, self.format_error, self.documents)


def parse_transcript(
    renderer: ChatRenderer, query: str, prompt: str | None, label: Any, max_steps: int
) -> ParsedTranscript:
    read = read_label(label)
    golden, question = read.golden_answers, read.question
    fmt = renderer.format
    parsed = ParsedTranscript(question=question or renderer.question_of(prompt or "") or "", golden_answers=golden)
    if not golden:
        parsed.problem = f"its label names no golden answers ({str(label)[:80]!r})"
    elif prompt is None or not query.startswith(prompt):
        parsed.problem = "the query does not start with its prompt (send prompts exactly as the policy saw them)"
    if parsed.problem:
        return parsed
    response = query[len(prompt) :]
    for turn in renderer.split_response(response)[:max_steps]:
        if not turn.closed:  # generation cut off before its stop token: the step is incomplete
            parsed.format_error = "truncated"
            break
        try:
            step = fmt.read_turn(turn.action, after_documents=bool(parsed.steps))
        except FormatError as error:
            parsed.format_error = error.reason.value
            break
        parsed.steps.append(step)
        if step.is_final:
            break
        parsed.documents.append([p.contents for p in fmt.parse_documents(turn.observation)] if turn.observation else [])
    if not parsed.steps and parsed.format_error is None:
        parsed.format_error = "empty"
    return parsed


_STEP_LOGS = ("num_steps", "relevance_mean", "judge_fallbacks")


async def score_transcripts(
    renderer: ChatRenderer,
    judge: Judge,
    scheme: RewardScheme,
    metrics: RewardMetrics,
    queries: Sequence[str],
    prompts: Sequence[str] | None,
    labels: Sequence[Any] | None,
    max_steps: int,
) -> dict[str, Any]:
    """OpenRLHF's remote reward answer for a batch of transcripts: rewards, scores and extra_logs lists."""
    parsed = [
        parse_transcript(renderer, query, prompts[i] if prompts else None, labels[i] if labels else None, max_steps)
        for i, query in enumerate(queries)
    ]
    relevance_items, owners = [], []
    if scheme.needs_relevance:
        for index, transcript in enumerate(parsed):
            for step, documents in zip(transcript.steps, transcript.documents, strict=False):
                owners.append(index)
                relevance_items.append(RelevanceItem(transcript.question, step.query or "", documents, step.analysis))
    answered = [(i, t) for i, t in enumerate(parsed) if t.answer is not None and t.problem is None]
    relevance, verdicts = await asyncio.gather(  # both judge calls at once: a slow judge costs one wait
        judge.relevance(relevance_items) if relevance_items else _nothing(),
        correctness(judge, [CorrectnessItem(t.question, t.answer, t.golden_answers) for _, t in answered], metrics),
    )
    verdict_of = {i: v for (i, _), v in zip(answered, verdicts, strict=True)}
    scores_of: dict[int, list[JudgeResult]] = {}
    for owner, result in zip(owners, relevance, strict=True):
        scores_of.setdefault(owner, []).append(result)

    reported = (*SCORED_OUTCOMES, Outcome.UNREADABLE)  # extra_logs: one flag per outcome, by its value
    rewards, step_rewards, outcomes = [], [], []
    logs: dict[str, list[float]] = {key: [] for key in (*(o.value for o in reported), *_STEP_LOGS)}
    for index, transcript in enumerate(parsed):
        judged, verdict = scores_of.get(index, []), verdict_of.get(index)
        rel = [r.score for r in judged] if scheme.needs_relevance else [0.0] * len(transcript.documents)
        if transcript.problem:
            logger.warning("transcript %d gets a neutral reward: %s", index, transcript.problem)
            outcome, per_step = Outcome.UNREADABLE, []
        else:
            last = transcript.steps[-1] if transcript.steps else None
            outcome = classify(transcript.format_error, last, correct=verdict is not None and verdict.correct)
            per_step = scheme.step_rewards(build_episode(scheme, outcome, transcript.trace(), rel))
        rewards.append(sum(per_step))
        step_rewards.append(per_step)
        outcomes.append(outcome.value)
        for kind in reported:
            logs[kind.value].append(float(outcome is kind))
        logs["num_steps"].append(float(len(transcript.steps) + (transcript.format_error is not None)))
        logs["relevance_mean"].append(sum(rel) / len(rel) if rel else 0.0)
        logs["judge_fallbacks"].append(
            float(sum(r.fallback for r in judged) + bool(verdict and verdict.method == "fallback"))
        )
    return {
        "rewards": rewards,
        "scores": rewards,
        "extra_logs": logs,
        "step_rewards": step_rewards,
        "outcomes": outcomes,
    }
