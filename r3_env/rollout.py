"""Multi-turn rollouts in token space: generate a step, let the environment answer, repeat; then score.

:func:`run_episode` drives one :class:`r3_env.env.RetrievalEnv` against any engine that honours
OpenRLHF's contract ``await engine.generate(prompt_token_ids, sampling_params)`` (vLLM's rollout
actor, or :class:`r3_env.hf_engine.HFEngine` on CPU). It returns what OpenRLHF's executor returns
(observation tokens, action ranges, rollout log-probs) plus one reward per action, aligned with
``action_ranges``. Environment tokens are never inside an action range, so they are never trained on.

A :class:`RolloutContext` is shared by every episode in one event loop: its retrieval and judge
calls go through :class:`r3_env.batching.Coalescer`, so episodes in flight share batched requests.
When a service fails for good the episode is run again (``services.episode_retries``), then it is
returned flagged (``service_failure``) with a neutral reward of 0 on every step: the trainer never
sees the exception.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from r3_env.batching import Coalescer
from r3_env.config import ConfigError, configs_from_values, load_yaml
from r3_env.data import JsonlWriter, Label, read_label
from r3_env.env import EnvConfig, RetrievalEnv, StepKind, StepRecord
from r3_env.protocol import ChatRenderer, get_format
from r3_env.retrieval.base import Hit
from r3_env.retrieval.client import AsyncRetrievalClient, RetrievalServiceError
from r3_env.reward_client import AsyncRewardClient, Judgement, RewardServiceError, check_answer
from r3_env.rewards import BranchHit, Episode, Outcome, RewardScheme, get_scheme

logger = logging.getLogger(__name__)

SERVICE_ERRORS = (RetrievalServiceError, RewardServiceError)
CONFIG_ENV = "R3RAG_AGENT_CONFIG"  # YAML file with env:, reward:, services:, policy: sections
OVERRIDES_ENV = "R3RAG_AGENT_OVERRIDES"  # JSON object of dotted overrides, e.g. {"services.reward_url": "..."}


@dataclass(frozen=True)
class PolicyConfig:
    """How the policy sees the episode."""

    step_format: str = "r3"
    format_options: dict[str, Any] = field(default_factory=dict)  # the format's settings (multi_query: max_base, ...)
    chat_template: str = "auto"  # "auto" (the tokenizer's), "plain", or a Jinja template
    trajectory_log: str = ""  # append one JSON line per episode here ("{pid}" is replaced by the process id)


@dataclass(frozen=True)
class RewardConfig:
    """Which reward scheme, and where its rewards land in the token sequence."""

    scheme: str = "r3"
    options: dict[str, Any] = field(default_factory=dict)  # the scheme's constants
    placement: Literal["step", "scalar"] = "step"  # each step's reward at its last token, or the sum at the end
    query_encoder: str = ""  # encoder folder for schemes that compare query embeddings (lws)
    # The staged schemes' clock: training step = start_step + episodes this engine ran // episodes_per_step.
    # It counts every episode (evaluation and dynamic-filtering replacements too) and restarts with the
    # process: a resumed run sets start_step to the step it resumes from.
    episodes_per_step: int = 0
    start_step: int = 0

    def __post_init__(self) -> None:
        if self.episodes_per_step < 0 or self.start_step < 0:
            raise ValueError("episodes_per_step and start_step must be 0 or more")


@dataclass(frozen=True)
class ServicesConfig:
    """Where the retrieval service and the reward server are, and how hard to try them."""

    retriever_url: str = "http://127.0.0.1:8000"
    reward_url: str = "http://127.0.0.1:8002"
    timeout_s: float = 60.0  # per retrieval request
    judge_timeout_s: float = 300.0  # per judge request (a big judge under load is slow)
    retries: int = 3  # per request, with exponential backoff
    backoff_s: float = 0.5
    episode_retries: int = 1  # run an episode again after a service failure, then flag it
    batch_wait_ms: float = 5.0  # how long a request waits for others to share its batch
    max_batch: int = 256

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.judge_timeout_s <= 0 or self.batch_wait_ms < 0:
            raise ValueError("timeouts must be positive and batch_wait_ms 0 or more")
        if self.retries < 0 or self.episode_retries < 0 or self.max_batch < 1:
            raise ValueError("retries and episode_retries must be 0 or more, max_batch at least 1")


SECTIONS: dict[str, type] = {
    "env": EnvConfig,
    "reward": RewardConfig,
    "services": ServicesConfig,
    "policy": PolicyConfig,
}


@dataclass(frozen=True)
class RolloutConfig:
    env: EnvConfig = field(default_factory=EnvConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    services: ServicesConfig = field(default_factory=ServicesConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str = "rollout config") -> RolloutConfig:
        return cls(
            *configs_from_values(values, [(f"{name}.", section) for name, section in SECTIONS.items()], where=where)
        )

    @classmethod
    def from_environment(cls) -> RolloutConfig:
        """From ``$R3RAG_AGENT_CONFIG`` (a YAML file) and ``$R3RAG_AGENT_OVERRIDES`` (dotted keys, JSON).

        OpenRLHF builds the agent executor with no arguments inside its rollout actors, so this
        is how the launch scripts configure it (the launcher forwards both to every Ray worker).
        """
        path = os.environ.get(CONFIG_ENV)
        values = load_yaml(path) if path else {}
        overrides = os.environ.get(OVERRIDES_ENV)
        if overrides:
            try:
                pairs = json.loads(overrides)
            except ValueError:
                raise ConfigError(f"${OVERRIDES_ENV} must be a JSON object of dotted keys, got {overrides!r}") from None
            if not isinstance(pairs, dict):
                raise ConfigError(f"${OVERRIDES_ENV} must be a JSON object of dotted keys, got {overrides!r}")
            for key, value in pairs.items():
                section, _, name = key.partition(".")
                if not name:
                    raise ConfigError(f"${OVERRIDES_ENV}: {key!r} is not a dotted key like 'services.reward_url'")
                values.setdefault(section, {})
                if not isinstance(values[section], dict):
                    raise ConfigError(f"${OVERRIDES_ENV}: section {section!r} is not a mapping")
                values[section][name] = value
        return cls.from_dict(values, where=path or f"${OVERRIDES_ENV}")


@dataclass
class RolloutStats:
    """Counters for logs and the benchmark: where an episode's time goes."""

    episodes: int = 0
    generation_s: float = 0.0  # awaiting the engine
    wall_s: float = 0.0  # sum of episode wall times
    service_failures: int = 0

    @property
    def environment_s(self) -> float:
        """Parsing, retrieval, rendering, tokenizing feedback, scoring: everything but generation."""
        return self.wall_s - self.generation_s

    @property
    def environment_share(self) -> float:
        return self.environment_s / self.wall_s if self.wall_s else 0.0


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


class RolloutContext:
    """What every episode of one process shares: renderer, clients, batchers, the scheme and stats.

    Make it inside the event loop that runs the episodes (its batchers belong to that loop).
    ``search`` and ``judge`` may be given directly (an in-process retriever, tests); by default
    they are the HTTP clients of ``config.services``.
    """

    def __init__(
        self,
        config: RolloutConfig,
        tokenizer: Any,
        search: Any | None = None,
        judge: AsyncRewardClient | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.renderer = ChatRenderer(
            tokenizer,
            get_format(config.policy.step_format, **config.policy.format_options),
            config.policy.chat_template,
            doc_chars=config.env.doc_chars,
        )
        self.scheme: RewardScheme = get_scheme(config.reward.scheme, **config.reward.options)
        scheme = self.scheme
        if self.renderer.format.expands_from_context and (
            scheme.needs_relevance or scheme.needs_correctness or scheme.needs_query_similarity
        ):
            raise ConfigError(
                f"reward.scheme {scheme.name!r} judges answers or single queries, but policy.step_format "
                f"{config.policy.step_format!r} steers retrieval with several queries and never answers: "
                "use reward.scheme top_survivor (launch/configs/r2ag.yaml)"
            )
        services = config.services
        wait = services.batch_wait_ms / 1000
        self._retriever = search or AsyncRetrievalClient(
            services.retriever_url, timeout=services.timeout_s, retries=services.retries, backoff=services.backoff_s
        )
        self._judge = judge
        needs_judge = self.scheme.needs_relevance or self.scheme.needs_correctness
        if self._judge is None and needs_judge:
            self._judge = AsyncRewardClient(
                services.reward_url,
                timeout=services.judge_timeout_s,
                retries=services.retries,
                backoff=services.backoff_s,
            )
        topk = config.env.topk
        self.search_batcher: Coalescer[str, list[Hit]] = Coalescer(
            lambda queries: self._retriever.search(queries, topk),
            services.max_batch,
            wait,
            "retrieval",
            RetrievalServiceError,
        )
        judge_ = self._judge
        self.relevance_batcher: Coalescer[dict, Judgement] = Coalescer(
            lambda items: judge_.relevance(items), services.max_batch, wait, "relevance", RewardServiceError
        )
        self.correctness_batcher: Coalescer[dict, Judgement] = Coalescer(
            lambda items: judge_.correctness(items), services.max_batch, wait, "correctness", RewardServiceError
        )
        self.encoder, self.query_prefix = None, ""
        if self.scheme.needs_query_similarity:
            if not config.reward.query_encoder:
                raise ConfigError(
                    f"reward scheme {self.scheme.name!r} compares query embeddings: set reward.query_encoder "
                    "to an encoder folder (e5-base-v2, ...) or turn the scheme's diversity option off"
                )
            from r3_env.retrieval.config import instruction_prefix
            from r3_env.retrieval.encoder import Encoder

            # a sentence-transformers folder (Qwen3-Embedding, MiniLM) brings its own pooling; plain HF
            # encoders (E5) are mean-pooled, with their family's query instruction
            path = config.reward.query_encoder
            self.encoder = Encoder(path, sentence_transformer=(Path(path) / "modules.json").is_file())
            self.query_prefix = instruction_prefix(None, path, passage=False)
        self.clock: Callable[[], int] | None = clock
        if self.scheme.needs_training_step and clock is None and not config.reward.episodes_per_step:
            raise ConfigError(
                f"reward scheme {self.scheme.name!r} changes with the training step: set reward.episodes_per_step "
                "(rollout batch x samples per prompt / number of vLLM engines)"
            )
        self.special_ids = set(getattr(tokenizer, "all_special_ids", []))
        self.stats = RolloutStats()
        self._log: JsonlWriter | None = None
        if config.policy.trajectory_log:
            path = Path(config.policy.trajectory_log.replace("{pid}", str(os.getpid())))
            path.parent.mkdir(parents=True, exist_ok=True)
            self._log = JsonlWriter(path)

    async def search(self, query: str, k: int) -> list[Hit]:
        return await self.search_batcher.submit(query)

    @property
    def training_step(self) -> int:
        """The trainer's step as the staged schemes see it.

        OpenRLHF's rollout actors never learn the trainer's step, so there it is counted from the
        episodes this engine ran (``reward.episodes_per_step``, from ``reward.start_step``). A trainer
        that knows its step (the local one) sets :attr:`clock` instead.
        """
        if self.clock is not None:
            return self.clock()
        reward = self.config.reward
        return reward.start_step + (self.stats.episodes // reward.episodes_per_step if reward.episodes_per_step else 0)

    def log(self, record: dict[str, Any]) -> None:
        if self._log is not None:
            self._log.write(record)

    async def aclose(self) -> None:
        for client in (self._retriever, self._judge):
            close = getattr(client, "aclose", None)
            if close is not None:
                await close()
        if self._log is not None:
            self._log.close()


def _stop_params(sampling_params: Any, stop_ids: Sequence[int], max_tokens: int) -> Any:
    """A copy of the engine's sampling params that stops at the end of a step and within budget."""
    params = copy.deepcopy(sampling_params)
    params.max_tokens = max_tokens
    merged = list(dict.fromkeys([*(getattr(params, "stop_token_ids", None) or []), *stop_ids]))
    params.stop_token_ids = merged
    if hasattr(params, "_all_stop_token_ids"):  # vLLM caches the set at construction
        params._all_stop_token_ids.update(merged)
    return params


class _Trajectory:
    """Token-space state of one attempt; survives a service failure so the attempt can be returned flagged."""

    def __init__(self, prompt_tokens: list[int], want_logprobs: bool) -> None:
        self.tokens = list(prompt_tokens)
        self.action_ranges: list[tuple[int, int]] = []
        self.logprobs: list[float] | None = [0.0] * len(prompt_tokens) if want_logprobs else None
        self.truncated = False
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


def _action_logprobs(output: Any, tokens: Sequence[int]) -> list[float] | None:
    logprobs = getattr(output, "logprobs", None)
    if logprobs is None:
        return None
    values = []
    for token, entry in zip(tokens, logprobs, strict=False):
        item = entry.get(token) if isinstance(entry, dict) else None
        values.append(float(getattr(item, "logprob", item)) if item is not None else 0.0)
    return values + [0.0] * (len(tokens) - len(values))


async def _generate_and_act(
    ctx: RolloutContext,
    env: RetrievalEnv,
    traj: _Trajectory,
    engine: Any,
    sampling_params: Any,
    max_length: int,
    timing: dict[str, float],
) -> None:
    tokenizer, stop_ids = ctx.tokenizer, ctx.renderer.stop_token_ids
    while not env.done:
        budget = min(ctx.config.env.step_budget, max_length - len(traj.tokens))
        if budget <= 0:  # out of context: the episode ends without an answer
            env.done = True
            timing["out_of_context"] = 1.0
            break
        started = time.perf_counter()
        output = (await engine.generate(traj.tokens, _stop_params(sampling_params, stop_ids, budget))).outputs[0]
        timing["generation"] += time.perf_counter() - started
        action_tokens = list(output.token_ids)
        ended_turn = bool(action_tokens) and action_tokens[-1] in stop_ids
        # finished: the turn's end token, or another stop (the model's EOS, a stop string)
        finished = ended_turn or output.finish_reason == "stop"
        traj.truncated = output.finish_reason == "length"
        special_end = bool(action_tokens) and action_tokens[-1] in ctx.special_ids
        body = action_tokens[:-1] if finished and special_end else action_tokens
        text = tokenizer.decode(body, skip_special_tokens=False)
        try:
            result = await env.step(text, closed=finished, turn_ended=ended_turn)
        except SERVICE_ERRORS:  # keep the action: a flagged episode still returns what was generated
            traj.add_action(action_tokens, _action_logprobs(output, action_tokens))
            raise
        if result.retry:
            continue  # regenerate the step from the same context; the bad attempt is dropped
        traj.add_action(action_tokens, _action_logprobs(output, action_tokens))
        step = env.steps[-1]
        if step.kind is StepKind.QUERY and ctx.scheme.needs_relevance and result.documents:  # judged meanwhile
            item = {
                "question": env.question,
                "analysis": step.analysis,
                "query": step.query,
                "documents": [p.contents for p in result.documents],
            }
            traj.judging.append((step, asyncio.ensure_future(ctx.relevance_batcher.submit(item))))
        if result.feedback:
            traj.add_feedback(tokenizer(result.feedback, add_special_tokens=False)["input_ids"])


async def _collect_relevance(traj: _Trajectory) -> None:
    judged = await asyncio.gather(*(task for _, task in traj.judging))
    for (step, _), judgement in zip(traj.judging, judged, strict=True):
        step.relevance = min(1.0, max(0.0, judgement.score))
        step.relevance_fallback = judgement.fallback


def _mean_pairwise_cosine(ctx: RolloutContext, queries: list[str]) -> float:
    import numpy as np

    vectors = ctx.encoder.encode([ctx.query_prefix + query for query in queries])
    vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    sims = vectors @ vectors.T
    n = len(queries)
    return float((sims.sum() - np.trace(sims)) / (n * (n - 1)))


async def _score(
    ctx: RolloutContext, env: RetrievalEnv, traj: _Trajectory, label: Label
) -> tuple[Outcome, list[float], dict]:
    scheme = ctx.scheme
    if env.format_error is not None:
        outcome = Outcome.FORMAT_ERROR
    elif env.steps and env.steps[-1].kind is StepKind.STOP:
        outcome = Outcome.STOPPED
    elif env.answer is None:
        outcome = Outcome.NO_ANSWER
    else:
        outcome = Outcome.WRONG  # decided below when the scheme needs correctness
    verdict = None
    if outcome is Outcome.WRONG and scheme.needs_correctness:
        verdict = await check_answer(env.question, env.answer, label.golden_answers, ctx.correctness_batcher.submit)
        outcome = Outcome.CORRECT if verdict.score >= 0.5 else Outcome.WRONG
    await _collect_relevance(traj)
    queries = [s for s in env.steps if s.kind is StepKind.QUERY]
    for step in queries:
        if scheme.needs_relevance and step.relevance is None:  # no document was shown: nothing was relevant
            step.relevance = 0.0
    gold = set(label.gold_ids)
    seen = {p.id for p in env.context} & gold
    before, branches = len(seen), []
    for step in queries:
        hits, found = [], set(seen)  # each query's top-1, in order: new when no earlier query or step found it
        for number, ids in enumerate(step.hits):
            top = ids[0] if ids else None
            hits.append(BranchHit(top in gold, top in gold and top not in found, number >= len(step.queries)))
            found.add(top)
        branches.append(hits)
        # found: what the step showed; a multi-query step's queries also each find their top-1 (R2AG's
        # vertices), which the environment's document limits may not have shown
        tops = [ids[0] for ids in step.hits if ids] if step.query is None else []
        fresh = {i for i in [*step.doc_ids, *tops] if i in gold} - seen
        step.new_gold = len(fresh)
        seen |= fresh
    similarity = None
    if scheme.needs_query_similarity and len(queries) > 1:
        similarity = await asyncio.to_thread(_mean_pairwise_cosine, ctx, [s.query for s in queries])
    episode = Episode(
        outcome,
        [s.relevance or 0.0 for s in queries],
        new_gold=[s.new_gold for s in queries] if scheme.needs_gold else (),
        gold_total=len(gold),
        queries=[s.query or "; ".join(s.queries + s.predicted) for s in queries],
        query_similarity=similarity,
        training_step=ctx.training_step,
        branches=branches if scheme.needs_gold else (),
        gold_before=before,
        stopped=bool(env.steps) and env.steps[-1].stop,
    )
    info = {
        "verdict": verdict.method if verdict else None,
        "judge_fallbacks": sum(s.relevance_fallback for s in queries) + bool(verdict and verdict.fallback),
        "gold_found": len(seen),
        "reward_step": episode.training_step if scheme.needs_training_step else None,
    }
    return outcome, scheme.step_rewards(episode), info


def _label_problem(ctx: RolloutContext, label: Label) -> str | None:
    if label.problem:
        return label.problem
    if ctx.scheme.needs_correctness and not label.golden_answers:
        return "its label names no golden answers"
    if ctx.scheme.needs_gold and not label.gold_ids:
        return "its label names no gold passage ids (gold_ids or metadata.supporting_passage_ids)"
    return None


def question_of(ctx: RolloutContext, prompt: str, label: Label) -> str:
    """The question: from the label, else from a prompt the renderer made, else the prompt itself."""
    return label.question or ctx.renderer.question_of(prompt) or prompt.strip()


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
    question = question_of(ctx, prompt, parsed_label)
    started = time.perf_counter()
    failure = None
    for attempt in range(ctx.config.services.episode_retries + 1):
        env = RetrievalEnv(ctx.config.env, ctx.renderer, ctx.search, question, parsed_label.start_documents)
        prompt_text = env.reset()
        prompt_tokens = ctx.tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
        room = max_length - min(ctx.config.env.step_budget, max_length // 2)
        if len(prompt_tokens) > room:
            logger.warning("prompt of %d tokens cut to %d to leave room for a step", len(prompt_tokens), room)
            prompt_tokens = prompt_tokens[-room:]
        traj = _Trajectory(prompt_tokens, getattr(sampling_params, "logprobs", None) is not None)
        timing = {"generation": 0.0}
        try:
            await _generate_and_act(ctx, env, traj, engine, sampling_params, max_length, timing)
            problem = _label_problem(ctx, parsed_label)
            if problem is None:
                outcome, step_rewards, info = await _score(ctx, env, traj, parsed_label)
            failure = None
            break
        except SERVICE_ERRORS as error:
            failure = error
            logger.warning("episode attempt %d failed: %s", attempt + 1, error)
        finally:
            traj.discard_judging()
    if failure is not None:
        ctx.stats.service_failures += 1
        logger.error("episode flagged with a neutral reward after %d attempts: %s", attempt + 1, failure)
        outcome_name, step_rewards, info = "service_failure", [0.0] * len(traj.action_ranges), {}
    elif problem is not None:
        logger.error("episode gets a neutral reward: %s (label %r)", problem, str(label)[:120])
        outcome_name, step_rewards, info = "label_problem", [0.0] * len(traj.action_ranges), {}
    else:
        outcome_name = outcome.value
    if len(step_rewards) != len(traj.action_ranges):
        raise AssertionError(f"{len(step_rewards)} step rewards for {len(traj.action_ranges)} actions")
    wall = time.perf_counter() - started
    stats = ctx.stats
    stats.episodes += 1
    stats.wall_s += wall
    stats.generation_s += timing["generation"]
    score = _score_value(ctx, outcome_name, info, parsed_label, step_rewards)
    steps = [s.to_json() for s in env.steps]
    record = {
        "question": question,
        "golden_answers": parsed_label.golden_answers,
        "steps": steps,
        "answer": env.answer,
        "outcome": outcome_name,
        "verdict": info.get("verdict"),
        "step_rewards": step_rewards,
        "num_docs": env.num_docs,
    }
    ctx.log(record)
    return RolloutResult(
        prompt=prompt,
        observation_tokens=traj.tokens,
        action_ranges=traj.action_ranges,
        rollout_log_probs=traj.logprobs,
        truncated=traj.truncated,
        step_rewards=step_rewards,
        score=score,
        outcome=outcome_name,
        record=record,
        extra_logs=_extra_logs(outcome_name, env, info, timing, wall),
    )


def _score_value(ctx: RolloutContext, outcome: str, info: dict, label: Label, step_rewards: list[float]) -> float:
    """OpenRLHF's per-sample score, which its dynamic filtering reads (see RewardScheme.score)."""
    if ctx.scheme.score == "reward":
        return float(sum(step_rewards))
    if ctx.scheme.score == "gold_recall":
        return float(bool(label.gold_ids) and info.get("gold_found", 0) == len(set(label.gold_ids)))
    return float(outcome == Outcome.CORRECT.value)


def _extra_logs(outcome: str, env: RetrievalEnv, info: dict, timing: dict, wall: float) -> dict[str, float]:
    queries = [s for s in env.steps if s.kind is StepKind.QUERY]
    judged = [s.relevance for s in queries if s.relevance is not None]
    logs = {f"outcome_{o.value}": float(outcome == o.value) for o in Outcome}
    logs.update(
        service_failure=float(outcome == "service_failure"),
        label_problem=float(outcome == "label_problem"),
        num_steps=float(len(env.steps)),
        retrievals=float(len(queries)),
        num_docs=float(env.num_docs),
        relevance_mean=sum(judged) / len(judged) if judged else 0.0,
        judge_fallbacks=float(info.get("judge_fallbacks", 0)),
        format_retries=float(sum(s.format_retries for s in env.steps)),
        out_of_context=timing.get("out_of_context", 0.0),
        environment_share=(wall - timing["generation"]) / wall if wall > 0 else 0.0,
    )
    if info.get("reward_step") is not None:  # the training step a staged scheme saw (when its stage switched)
        logs["reward_step"] = float(info["reward_step"])
    return logs
