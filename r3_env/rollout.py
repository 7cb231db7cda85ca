"""Multi-turn rollouts in token space: generate a step, let the environment answer, repeat; then score.

:func:`run_episode` drives one :class:`r3_env.env.RetrievalEnv` against any engine that honours
OpenRLHF's contract ``await engine.generate(prompt_token_ids, sampling_params)`` (vLLM's rollout
actor, or :class:`r3_env.engines.HFEngine` on CPU). It returns what OpenRLHF's executor returns
(observation tokens, action ranges, rollout log-probs) plus one reward per action, aligned with
``action_ranges``. Environment tokens are never inside an action range, so they are never trained on.

Every episode of a process shares one :class:`r3_env.rollout_context.RolloutContext` (renderer,
batched service clients, the reward scheme); its settings are :class:`r3_env.rollout_config.RolloutConfig`.
When a service fails for good the episode is run again (``services.episode_retries``), then it is
returned flagged (``service_failure``) with a neutral reward of 0 on every step: the trainer never
sees the exception.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from r3_env.answers import judged_correct
from r3_env.data import Label, read_label
from r3_env.env import RetrievalEnv, StepKind, StepRecord
from r3_env.episode import ROLLOUT_OUTCOMES, Outcome, Trace, build_episode, classify
from r3_env.retrieval.client import RetrievalServiceError
from r3_env.reward_client import RewardServiceError, check_answer
from r3_env.rollout_context import RolloutContext

logger = logging.getLogger(__name__)

SERVICE_ERRORS = (RetrievalServiceError, RewardServiceError)


async def run_episode(
    ctx: RolloutContext,
    engine: Any,
    prompt: str,
    label: Any,
    sampling_params: Any,
    max_length: int,
) -> RolloutResult:
    """One scored episode. ``prompt`` is the dataset's input (the question); ``label`` its answers (any
    shape :func:`r3_env.data.read_label` reads)."""
    parsed_label = read_label(label)
    question = ctx.question_of(prompt, parsed_label)
    problem = ctx.label_problem(parsed_label)  # a label the scheme cannot score: played, then a neutral reward
    started = time.perf_counter()
    failure: Exception | None = None
    scored: tuple[Outcome, list[float], dict[str, Any]] | None = None
    attempts = ctx.config.services.episode_retries + 1
    for attempt in range(1, attempts + 1):
        env = RetrievalEnv(ctx.config.env, ctx.renderer, ctx.search, question, parsed_label.start_documents)
        traj = _Trajectory(getattr(sampling_params, "logprobs", None) is not None)
        try:
            traj.add_feedback(_prompt_tokens(ctx, await env.start(), max_length))
            await _generate_and_act(ctx, env, traj, engine, sampling_params, max_length)
            scored = None if problem else await _score(ctx, env, traj, parsed_label)
            failure = None
            break
        except SERVICE_ERRORS as error:  # the whole episode again: its judgements are not worth keeping
            failure = error
            if not traj.tokens:  # the question's own retrieval failed: the flagged episode is its prompt
                traj.add_feedback(_prompt_tokens(ctx, env.reset(), max_length))
            logger.warning("episode attempt %d failed: %s", attempt, error)
        finally:
            traj.discard_judging()
    neutral = [0.0] * len(traj.action_ranges)
    if failure is not None:
        ctx.stats.service_failures += 1
        logger.error("episode flagged with a neutral reward after %d attempts: %s", attempt, failure)
        outcome, step_rewards, info = Outcome.SERVICE_FAILURE, neutral, {}
    elif scored is None:
        logger.error("episode gets a neutral reward: %s (label %r)", problem, str(label)[:120])
        outcome, step_rewards, info = Outcome.LABEL_PROBLEM, neutral, {}
    else:
        outcome, step_rewards, info = scored
    if len(step_rewards) != len(traj.action_ranges):
        raise AssertionError(f"{len(step_rewards)} step rewards for {len(traj.action_ranges)} actions")
    wall = time.perf_counter() - started
    stats = ctx.stats
    stats.episodes += 1
    stats.wall_s += wall
    stats.generation_s += traj.generation_s
    record = {
        "question": question,
        "golden_answers": parsed_label.golden_answers,
        "steps": [s.to_json() for s in env.steps],
        "answer": env.answer,
        "outcome": outcome.value,
        "verdict": info.get("verdict"),
        "step_rewards": step_rewards,
        "num_docs": env.num_docs,
    }
    if env.question_documents:
        record["question_doc_ids"] = [p.id for p in env.question_documents]
    if ctx.clock is not None:  # a trainer that knows its step resumes from it: a reader drops the redone rows
        record.update(training_step=ctx.training_step, run=ctx.run_id)
    ctx.log(record)
    return RolloutResult(
        prompt=prompt,
        observation_tokens=traj.tokens,
        action_ranges=traj.action_ranges,
        rollout_log_probs=traj.logprobs,
        truncated=traj.truncated,
        step_rewards=step_rewards,
        score=_score_value(ctx, outcome, info, parsed_label, step_rewards),
        outcome=outcome.value,
        record=record,
        extra_logs=_extra_logs(outcome, env, info, traj, wall),
    )


@dataclass
class RolloutResult:
    """One episode in OpenRLHF's executor shape plus the per-step rewards and the record."""

    prompt: str
    observation_tokens: list[int]
    action_ranges: list[tuple[int, int]]
    rollout_log_probs: list[float] | None
    truncated: bool
    step_rewards: list[float]
    score: float
    outcome: str
    record: dict[str, Any]
    extra_logs: dict[str, float]

    @property
    def reward(self) -> float:
        return float(sum(self.step_rewards))


class _Trajectory:
    """Token-space state of one attempt; survives a service failure so the attempt can be returned flagged."""

    def __init__(self, want_logprobs: bool) -> None:
        self.tokens: list[int] = []  # the prompt's (added as the first feedback), then actions and feedback
        self.action_ranges: list[tuple[int, int]] = []
        self.logprobs: list[float] | None = [] if want_logprobs else None
        self.truncated = False
        self.out_of_context = False  # the context ran out before the episode ended
        self.generation_s = 0.0  # awaiting the engine
        # relevance judgements started as soon as each retrieval step's documents are known
        self.judging: list[tuple[StepRecord, asyncio.Future]] = []

    def discard_judging(self) -> None:
        """Cancel judgements still running; collect the failure of finished ones (nothing is left unobserved)."""
        for _, task in self.judging:
            if task.done():
                if not task.cancelled():
                    task.exception()
            else:
                task.cancel()

    def add_action(self, tokens: Sequence[int], logprobs: Sequence[float] | None) -> None:
        start = len(self.tokens)
        self.tokens.extend(tokens)
        self.action_ranges.append((start, len(self.tokens)))
        if self.logprobs is not None:
            self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(tokens))

    def add_feedback(self, tokens: Sequence[int]) -> None:
        self.tokens.extend(tokens)
        if self.logprobs is not None:
            self.logprobs.extend([0.0] * len(tokens))


def _prompt_tokens(ctx: RolloutContext, prompt: str, max_length: int) -> list[int]:
    """The episode's prompt as tokens, its start cut when it would leave no room for a step."""
    tokens = ctx.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    room = max_length - min(ctx.config.env.step_budget, max_length // 2)
    if len(tokens) > room:
        logger.warning("prompt of %d tokens cut to %d to leave room for a step", len(tokens), room)
        tokens = tokens[-room:]
    return tokens


async def _generate_and_act(
    ctx: RolloutContext, env: RetrievalEnv, traj: _Trajectory, engine: Any, sampling_params: Any, max_length: int
) -> None:
    """Generate a step, let the environment act on it, feed its documents back; until the episode ends."""
    tokenizer, stop_ids = ctx.tokenizer, ctx.renderer.stop_token_ids
    while not env.done:
        budget = min(ctx.config.env.step_budget, max_length - len(traj.tokens))
        if budget <= 0:  # out of context: the episode ends without an answer
            env.done = traj.out_of_context = True
            break
        started = time.perf_counter()
        output = (await engine.generate(traj.tokens, _stop_params(sampling_params, stop_ids, budget))).outputs[0]
        traj.generation_s += time.perf_counter() - started
        action_tokens = list(output.token_ids)
        ended_turn = bool(action_tokens) and action_tokens[-1] in stop_ids
        # finished: the turn's end token, or another stop (the model's EOS, a stop string)
        finished = ended_turn or output.finish_reason == "stop"
        traj.truncated = output.finish_reason == "length"
        special_end = bool(action_tokens) and action_tokens[-1] in ctx.special_ids
        body = action_tokens[:-1] if finished and special_end else action_tokens
        text = tokenizer.decode(body, skip_special_tokens=False)
        cut = env.action_end(text)
        if cut is not None:  # env.stop_after_action: the step ends with its action, as at a stop string
            action_tokens = _tokens_through(tokenizer, body, cut)
            text = tokenizer.decode(action_tokens, skip_special_tokens=False)
            finished, ended_turn, traj.truncated = True, False, False
        try:
            result = await env.step(text, closed=finished, turn_ended=ended_turn)
        except SERVICE_ERRORS:  # keep the action: a flagged episode still returns what was generated
            traj.add_action(action_tokens, _action_logprobs(output, action_tokens))
            raise
        if result.retry:
            continue  # regenerate the step from the same context; the bad attempt is dropped
        traj.add_action(action_tokens, _action_logprobs(output, action_tokens))
        record = env.steps[-1]
        if record.kind is StepKind.QUERY and ctx.scheme.needs_relevance and result.documents:  # judged meanwhile
            item = {
                "question": env.question,
                "analysis": record.step.analysis,
                "query": record.step.query,
                "documents": [p.contents for p in result.documents],
            }
            traj.judging.append((record, asyncio.ensure_future(ctx.relevance_batcher.submit(item))))
        if result.feedback:
            traj.add_feedback(tokenizer(result.feedback, add_special_tokens=False)["input_ids"])


def _tokens_through(tokenizer: Any, tokens: Sequence[int], chars: int) -> list[int]:
    """The shortest start of ``tokens`` whose text holds the first ``chars`` characters of theirs."""
    low, high = 0, len(tokens)
    while low < high:
        middle = (low + high) // 2
        if len(tokenizer.decode(tokens[:middle], skip_special_tokens=False)) >= chars:
            high = middle
        else:
            low = middle + 1
    return list(tokens[:low])


def _stop_params(sampling_params: Any, stop_ids: Sequence[int], max_tokens: int) -> Any:
    """A copy of the engine's sampling params that stops at the end of a step and within budget."""
    params = copy.deepcopy(sampling_params)
    params.max_tokens = max_tokens
    merged = list(dict.fromkeys([*(getattr(params, "stop_token_ids", None) or []), *stop_ids]))
    params.stop_token_ids = merged
    if hasattr(params, "_all_stop_token_ids"):  # vLLM caches the set at construction
        params._all_stop_token_ids.update(merged)
    return params


def _action_logprobs(output: Any, tokens: Sequence[int]) -> list[float] | None:
    logprobs = getattr(output, "logprobs", None)
    if logprobs is None:
        return None
    values = []
    for token, entry in zip(tokens, logprobs, strict=False):
        item = entry.get(token) if isinstance(entry, dict) else None
        values.append(float(getattr(item, "logprob", item)) if item is not None else 0.0)
    return values + [0.0] * (len(tokens) - len(values))


async def _score(
    ctx: RolloutContext, env: RetrievalEnv, traj: _Trajectory, label: Label
) -> tuple[Outcome, list[float], dict]:
    """The outcome, the scheme's step rewards and what the logs report of the scoring."""
    scheme = ctx.scheme
    verdict = None
    if env.answer is not None and scheme.needs_correctness:
        verdict = await check_answer(env.question, env.answer, label.golden_answers, ctx.correctness_batcher.submit)
    last = env.steps[-1].step if env.steps else None
    outcome = classify(env.format_error, last, correct=verdict is not None and judged_correct(verdict.score))
    judged = await asyncio.gather(*(task for _, task in traj.judging))
    for (record, _), judgement in zip(traj.judging, judged, strict=True):
        record.relevance = min(1.0, max(0.0, judgement.score))
        record.relevance_fallback = judgement.fallback
    queries = [r for r in env.steps if r.kind is StepKind.QUERY]
    for record in queries:
        if scheme.needs_relevance and record.relevance is None:  # no document was shown: nothing was relevant
            record.relevance = 0.0
    gold = env.gold_progress(label.gold_ids)
    similarity = None
    if scheme.needs_query_similarity and len(queries) > 1:
        similarity = await asyncio.to_thread(ctx.query_similarity, [r.step.query for r in queries])
    steps = [r.step for r in env.steps if r.step is not None]
    documents = [[p.contents for p in shown] for shown in env.documents]
    trace = Trace(env.question, label.golden_answers, steps, env.format_error, documents)
    relevance = [r.relevance or 0.0 for r in queries]
    episode = build_episode(scheme, outcome, trace, relevance, gold, similarity, ctx.training_step)
    info = {
        "verdict": verdict.method if verdict else None,
        "judge_fallbacks": sum(r.relevance_fallback for r in queries) + bool(verdict and verdict.fallback),
        "gold_found": gold.before + sum(gold.new),
        "new_gold": sum(gold.new),  # found by the episode's own searches, not already in its start
        "reward_step": episode.training_step if scheme.needs_training_step else None,
    }
    return outcome, scheme.step_rewards(episode), info


def _score_value(ctx: RolloutContext, outcome: Outcome, info: dict, label: Label, step_rewards: list[float]) -> float:
    """OpenRLHF's per-sample score, which its dynamic filtering reads (see RewardScheme.score)."""
    if ctx.scheme.score == "reward":
        return float(sum(step_rewards))
    if ctx.scheme.score == "gold_recall":
        return float(bool(label.gold_ids) and info.get("gold_found", 0) == len(set(label.gold_ids)))
    return float(outcome is Outcome.CORRECT)


def _extra_logs(outcome: Outcome, env: RetrievalEnv, info: dict, traj: _Trajectory, wall: float) -> dict[str, float]:
    queries = [s for s in env.steps if s.kind is StepKind.QUERY]
    judged = [s.relevance for s in queries if s.relevance is not None]
    logs = {o.log_key: float(outcome is o) for o in ROLLOUT_OUTCOMES}
    logs.update(
        num_steps=float(len(env.steps)),
        retrievals=float(len(queries)),
        num_docs=float(env.num_docs),
        relevance_mean=sum(judged) / len(judged) if judged else 0.0,
        new_gold=float(info.get("new_gold", 0)),
        judge_fallbacks=float(info.get("judge_fallbacks", 0)),
        format_retries=float(sum(s.format_retries for s in env.steps)),
        out_of_context=float(traj.out_of_context),
        environment_share=(wall - traj.generation_s) / wall if wall > 0 else 0.0,
    )
    if info.get("reward_step") is not None:  # the training step a staged scheme saw (when its stage switched)
        logs["reward_step"] = float(info["reward_step"])
    return logs
