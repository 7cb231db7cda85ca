"""Reward schemes, selected by name: from what happened in an episode to one reward per policy step.

An :class:`Episode` records the outcome and, for each retrieval step, the judge's relevance of
the documents it brought back. A scheme turns it into per-step rewards aligned with the policy's
steps (each retrieval step, then the final answer or the step that broke the format); their sum
is the scalar episode reward.

- ``r3`` is R3-RAG's scheme (docs/recipes/r3-rag.md#stage-2-rl: the official constants, all configurable):
  process rewards (relevance) scaled by the outcome, plus the answer step's reward.
- ``r3_gold`` is ``r3`` with each step's relevance from the labels instead of a judge: the share of the
  question's gold passages that the step found first (annotated data only; report it apart from judged runs).
- ``outcome`` is the ablation without process rewards: the same answer and format terms.
- ``lws`` is "Learning when to search"'s r = r_a + r_s + r_f: a staged answer reward (stage 1
  rewards retrieving when wrong, stage 2 charges retrieval when right), a search term (query
  conciseness, or query diversity when it retrieved more than once) and a +-1 format term. One
  episode-level reward, placed at the last step.
- ``gold_hit`` rewards each retrieval step by the gold passages it found first, and answering
  once all were found; answering before that zeroes the episode. It needs no judge.
- ``top_survivor`` is R2AG's expansion-step reward (docs/recipes/r2ag.md#rewards) for the ``multi_query``
  format: new gold documents among each query's top-1 (Multi-Hit), stopping with every gold
  document found (Joint-Hit), the average precision of the first t base and predicted queries'
  top-1 results (Top-t/x AP) and a small format bonus. It needs only the gold passage ids.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from r3_env.episode import BranchHit as BranchHit  # a scheme's whole API is importable from here
from r3_env.episode import Episode, Outcome, Signal
from r3_env.recipes import r2ag_agent
from r3_env.retrieval.metrics import average_precision


@dataclass(frozen=True)
class R3RewardConfig:
    """R3-RAG's constants: relevance is scaled by (1 + bonus) when correct, (1 - penalty) otherwise."""

    correct_scale: float = 1.0 + 0.6
    wrong_scale: float = 1.0 - 0.2
    no_answer_scale: float = 1.0 - 0.1
    correct_answer_reward: float = 2.0
    wrong_answer_reward: float = 0.0
    format_error_reward: float = -(1.0 - 0.1)
    # relevance of the valid steps before a format error is kept as it is
    format_error_scale: float = 1.0
    process_rewards: bool = True  # False: the outcome-only ablation
    # "sum": the paper's, each step earns its relevance, so every extra search adds to the episode's reward
    # (a 135M policy learned to search again until its steps ran out, docs/results.md); "mean": each step's
    # relevance is divided by the episode's retrievals, so searching more pays only when it raises the mean.
    process_aggregate: Literal["sum", "mean"] = "sum"

    def __post_init__(self) -> None:
        if self.process_aggregate not in ("sum", "mean"):
            raise ValueError(
                f"reward.options process_aggregate must be 'sum' or 'mean', got {self.process_aggregate!r}"
            )

    def scale(self, outcome: Outcome) -> float:
        return {
            Outcome.CORRECT: self.correct_scale,
            Outcome.WRONG: self.wrong_scale,
            Outcome.NO_ANSWER: self.no_answer_scale,
            Outcome.STOPPED: self.no_answer_scale,
            Outcome.FORMAT_ERROR: self.format_error_scale,
        }[outcome]

    def final_reward(self, outcome: Outcome) -> float:
        return {
            Outcome.CORRECT: self.correct_answer_reward,
            Outcome.WRONG: self.wrong_answer_reward,
            Outcome.STOPPED: self.wrong_answer_reward,
            Outcome.FORMAT_ERROR: self.format_error_reward,
        }[outcome]


def r3_step_rewards(episode: Episode, config: R3RewardConfig | None = None) -> list[float]:
    """Per-step rewards of R3-RAG's scheme."""
    config = config or R3RewardConfig()
    scale = config.scale(episode.outcome) if config.process_rewards else 0.0
    if config.process_aggregate == "mean" and episode.retrievals:
        scale /= episode.retrievals
    rewards = [relevance * scale for relevance in episode.relevance]
    if episode.outcome is not Outcome.NO_ANSWER:
        rewards.append(config.final_reward(episode.outcome))
    return rewards


def r3_gold_step_rewards(episode: Episode, config: R3RewardConfig | None = None) -> list[float]:
    """R3-RAG's scheme with each step's relevance read from the labels, not judged: the share of the question's
    gold passages the step found first. A search that finds nothing new earns nothing, so searching again
    does not pay, and the relevance of an episode sums to at most 1."""
    if episode.gold_total < 1:
        raise ValueError(
            "r3_gold needs the gold passages of each question: give labels with gold_ids "
            "(r3_env.data.read_label reads supporting_passage_ids or gold_ids)"
        )
    if len(episode.new_gold) != episode.retrievals:
        raise ValueError("r3_gold needs the gold passages each retrieval step found first (Episode.new_gold)")
    relevance = [found / episode.gold_total for found in episode.new_gold]
    return r3_step_rewards(dataclasses.replace(episode, relevance=relevance), config)


def at_last_step(episode: Episode, reward: float) -> list[float]:
    """An episode-level reward as per-step rewards: zeros, then ``reward`` at the last step."""
    return [0.0] * (episode.num_steps - 1) + [reward]


_QUESTION_WORDS = frozenset("what who whom whose which when where why how".split())
# Words a keyword query can do without: articles, prepositions, auxiliaries, pronouns, fillers.
_FUNCTION_WORDS = frozenset(
    """a an the of in on at to for from by with about into onto over under between during after before
    and or is are was were be been being do does did has have had can could would should will shall may
    might must it its this that these those he she they them his her their there please tell me find
    information any some""".split()
)


def is_concise(query: str, max_words: int = 10) -> bool:
    """The rule for a concise search query (LWS: no question words, prepositions or irrelevant modifiers).

    Concise means: 1 to ``max_words`` words, no question mark, no question word, and function words
    (articles, prepositions, auxiliaries, pronouns, fillers such as "please" or "information") at most
    a third of the words. "Hestolvale Tower director" and "birthplace of Marta Kell" pass; "who
    directed Hestolvale Tower" and "the name of the director of the film" do not.
    """
    words = re.findall(r"[\w']+", query.lower())
    if not words or len(words) > max_words or "?" in query or _QUESTION_WORDS & set(words):
        return False
    return sum(word in _FUNCTION_WORDS for word in words) * 3 <= len(words)


@dataclass(frozen=True)
class LWSRewardConfig:
    """ "Learning when to search" (docs/recipes/lws.md#reward): r = answer (staged by RC) + search + format."""

    beta: float = 0.3  # cost (stage 2) or bonus (stage 1, when wrong) per retrieval
    switch_step: int = 100  # training step at which stage 2 starts (0: stage 2 from the start)
    correct_reward: float = 1.0
    wrong_reward: float = -1.0
    format_reward: float = 1.0  # +this when the trajectory has one of the format's valid shapes, -this otherwise
    verbose_query_penalty: float = -1.0  # RC <= 1 and the query is not concise
    max_query_words: int = 10
    diversity: bool = True  # RC > 1: minus the mean pairwise cosine similarity of the query embeddings

    def __post_init__(self) -> None:
        if self.beta < 0 or self.switch_step < 0 or self.max_query_words < 1:
            raise ValueError("beta and switch_step must be 0 or more, max_query_words at least 1")


def lws_reward(episode: Episode, config: LWSRewardConfig) -> float:
    """The episode's reward r_a + r_s + r_f (docs/recipes/lws.md#reward).

    r_a: stage 1 (training step < switch_step) gives correct 1, wrong -1 + beta RC; stage 2 gives
    correct 1 - beta RC, wrong -1. No answer counts as wrong. r_s: RC > 1 gives minus the mean
    pairwise cosine of the query embeddings; RC <= 1 gives -1 for a query that is not concise,
    else 0. r_f: +1 when the trajectory has a valid shape, which both end in an answer (so a
    format error, or running out of steps, gives -1).
    """
    rc = episode.retrievals
    correct = episode.outcome is Outcome.CORRECT
    if episode.training_step < config.switch_step:  # stage 1: retrieving is encouraged when wrong
        answer = config.correct_reward if correct else config.wrong_reward + config.beta * rc
    else:  # stage 2: retrieval the answer did not need costs
        answer = config.correct_reward - config.beta * rc if correct else config.wrong_reward
    if rc > 1:
        if config.diversity and episode.query_similarity is None:
            raise ValueError("lws with diversity needs the query embeddings' similarity (reward.query_encoder)")
        search = -(episode.query_similarity or 0.0) if config.diversity else 0.0
    elif rc == 1 and episode.queries and not is_concise(episode.queries[0], config.max_query_words):
        search = config.verbose_query_penalty
    else:
        search = 0.0
    valid_shape = episode.outcome in (Outcome.CORRECT, Outcome.WRONG)
    return answer + search + (config.format_reward if valid_shape else -config.format_reward)


@dataclass(frozen=True)
class GoldHitConfig:
    """Gold-hit process reward: per new gold passage, and a bonus for answering once all were found."""

    hit_reward: float = 0.2  # per gold passage a retrieval step found first (R2AG's alpha)
    complete_bonus: float = 0.3  # answering with every gold passage found (R2AG's beta)
    format_error_reward: float = 0.0  # R2AG zeroes the episode on a format failure


def gold_hit_step_rewards(episode: Episode, config: GoldHitConfig) -> list[float]:
    if episode.gold_total < 1:
        raise ValueError(
            "gold_hit needs the gold passages of each question: give labels with gold_ids "
            "(r3_env.data.read_label reads supporting_passage_ids or gold_ids)"
        )
    found = episode.gold_before + sum(episode.new_gold)
    hits = [config.hit_reward * n for n in episode.new_gold]
    if episode.outcome is Outcome.NO_ANSWER:
        return hits
    if episode.outcome is Outcome.FORMAT_ERROR:
        return [0.0] * episode.retrievals + [config.format_error_reward]
    if found < episode.gold_total:  # it stopped before finding every gold passage
        return [0.0] * episode.num_steps
    return hits + [config.complete_bonus]


@dataclass(frozen=True)
class TopSurvivorConfig:
    """R2AG's R = alpha R_MH + beta R_JH + gamma R_AP + omega R_f (docs/recipes/r2ag.md#rewards; omega not given).

    The constants' values live in R2AG's recipe (recipes/r2ag.yaml: reward.options); :func:`top_survivor_config`
    fills those not given from there.
    """

    alpha: float  # Multi-Hit@Top-1: new gold documents among the queries' top-1 results
    beta: float  # Joint-Hit@Top-1: every gold document found by the end of the step, and stop signalled
    gamma: float  # Top-t/x average precision of the base and the predicted queries' top-1 results
    omega: float
    predicted_weight: float  # l: a predicted query's new gold counts this much in R_MH
    format_bonus: float  # R_f per query block after the think block ...
    format_cap: float  # ... with omega * R_f at most this
    survivors_base: int  # t for base queries: the first t (in the order written) make the AP
    survivors_predicted: int  # t for predicted queries

    def __post_init__(self) -> None:
        if self.survivors_base < 1 or self.survivors_predicted < 0:
            raise ValueError("survivors_base must be at least 1 and survivors_predicted 0 or more")


def top_survivor_config(**options: Any) -> TopSurvivorConfig:
    """``options`` over R2AG's recipe's constants (recipes/r2ag.yaml: reward.options)."""
    return TopSurvivorConfig(**{**r2ag_agent().reward.options, **options})


def top_t_average_precision(hits: Sequence[bool], t: int, gold_total: int) -> float:
    """R2AG's Top-t/x AP: the average precision of the first ``t`` results only."""
    return average_precision(hits[:t], gold_total)


def top_survivor_step_rewards(episode: Episode, config: TopSurvivorConfig) -> list[float]:
    """Per-step R2AG rewards; every step gets 0 on a format error (a missing think block, truncation)
    or when stop is signalled before every gold document was found."""
    if episode.gold_total < 1:
        raise ValueError("top_survivor needs the gold passages of each question: give labels with gold_ids")
    if episode.branches and len(episode.branches) != episode.retrievals:
        raise ValueError("top_survivor needs one list of branch hits per retrieval step")
    stopped = episode.stopped or episode.outcome is Outcome.STOPPED
    complete = episode.gold_before + sum(episode.new_gold) >= episode.gold_total
    if episode.outcome is Outcome.FORMAT_ERROR or (stopped and not complete):
        return [0.0] * episode.num_steps
    rewards = []
    for branches in episode.branches or [()] * episode.retrievals:
        base = [b for b in branches if not b.predicted]
        predicted = [b for b in branches if b.predicted]
        multi_hit = sum(b.gold and b.new for b in base) + config.predicted_weight * sum(
            b.gold and b.new for b in predicted
        )
        # a result counts for AP once: not a gold document the context or an earlier query already holds
        precision = top_t_average_precision(
            [b.gold and b.new for b in base], config.survivors_base, episode.gold_total
        ) + top_t_average_precision(
            [b.gold and b.new for b in predicted], config.survivors_predicted, episode.gold_total
        )
        form = min(config.format_cap, config.omega * config.format_bonus * len(branches))
        rewards.append(config.alpha * multi_hit + config.gamma * precision + form)
    if episode.outcome is Outcome.STOPPED:
        rewards.append(config.beta)  # complete (checked above): the Joint-Hit
    elif stopped:
        rewards[-1] += config.beta
    return rewards


@dataclass(frozen=True)
class RewardScheme:
    """A named scheme: ``step_rewards(episode)`` and what the episode must carry for it.

    ``needs_relevance``: the relevance judge; ``needs_correctness``: the answer's correctness
    (match, then judge); ``needs_gold``: the dataset's gold passage ids; ``needs_query_similarity``:
    query embeddings (an encoder); ``needs_training_step``: the trainer's step (staged schemes).
    ``stage_switch`` is the training step where a staged scheme changes (reports mark it).
    ``score`` is the per-sample score OpenRLHF's dynamic filtering reads (groups whose mean score
    falls outside ``--algo.dynamic_filtering_range`` are dropped): answer ``accuracy``,
    ``gold_recall`` (every gold passage found), or the episode's ``reward`` (top_survivor: 0 for a
    broken step or a stop before every gold passage was found, at least the format bonus otherwise;
    the range (0, inf) drops the all-zero groups, while groups whose rewards are all equal and
    positive stay, with zero advantages).
    ``signals`` maps the names of the scheme's own episode signals to the functions that compute them
    from the episode's :class:`r3_env.episode.Trace`; the scheme reads their values in ``episode.signals``.
    The rollout and the reward server compute them alike, so a scheme with a new signal changes nothing else.
    """

    name: str
    step_rewards: Callable[[Episode], list[float]]
    needs_relevance: bool
    needs_correctness: bool = True
    needs_gold: bool = False
    needs_query_similarity: bool = False
    needs_training_step: bool = False
    stage_switch: int | None = None
    score: Literal["accuracy", "gold_recall", "reward"] | None = None  # None: accuracy when it needs correctness
    signals: Mapping[str, Signal] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.score is None:
            object.__setattr__(self, "score", "accuracy" if self.needs_correctness else "gold_recall")


_SCHEMES: dict[str, Callable[..., RewardScheme]] = {}


def register_scheme(name: str, factory: Callable[..., RewardScheme]) -> None:
    if name in _SCHEMES:
        raise ValueError(f"reward scheme {name!r} is already registered")
    _SCHEMES[name] = factory


def available_schemes() -> list[str]:
    return sorted(_SCHEMES)


def get_scheme(name: str, **options) -> RewardScheme:
    """The scheme registered under ``name``; ``options`` are its constants (e.g. correct_answer_reward=1.0)."""
    try:
        factory = _SCHEMES[name]
    except KeyError:
        raise ValueError(f"unknown reward scheme {name!r}; choose one of: {', '.join(available_schemes())}") from None
    try:
        return factory(**options)
    except TypeError as error:  # an option the scheme's config does not have
        raise ValueError(f"reward scheme {name!r}: {error}") from None


def _r3(**options) -> RewardScheme:
    config = R3RewardConfig(**options)
    return RewardScheme("r3", lambda episode: r3_step_rewards(episode, config), needs_relevance=config.process_rewards)


def _r3_gold(**options) -> RewardScheme:
    if options.get("process_rewards") is False:
        raise ValueError("r3_gold is R3's process reward: without process_rewards it is the outcome scheme")
    config = R3RewardConfig(**options)
    return RewardScheme(
        "r3_gold", lambda episode: r3_gold_step_rewards(episode, config), needs_relevance=False, needs_gold=True
    )


def _outcome(**options) -> RewardScheme:
    config = R3RewardConfig(**{**options, "process_rewards": False})
    return RewardScheme("outcome", lambda episode: r3_step_rewards(episode, config), needs_relevance=False)


def _lws(**options) -> RewardScheme:
    config = LWSRewardConfig(**options)
    return RewardScheme(
        "lws",
        lambda episode: at_last_step(episode, lws_reward(episode, config)),
        needs_relevance=False,
        needs_query_similarity=config.diversity,
        needs_training_step=True,
        stage_switch=config.switch_step,
    )


def _gold_hit(**options) -> RewardScheme:
    config = GoldHitConfig(**options)
    return RewardScheme(
        "gold_hit",
        lambda episode: gold_hit_step_rewards(episode, config),
        needs_relevance=False,
        needs_correctness=False,
        needs_gold=True,
    )


def _top_survivor(**options) -> RewardScheme:
    config = top_survivor_config(**options)
    return RewardScheme(
        "top_survivor",
        lambda episode: top_survivor_step_rewards(episode, config),
        needs_relevance=False,
        needs_correctness=False,
        needs_gold=True,
        score="reward",
    )


register_scheme("r3", _r3)
register_scheme("r3_gold", _r3_gold)
register_scheme("outcome", _outcome)
register_scheme("lws", _lws)
register_scheme("gold_hit", _gold_hit)
register_scheme("top_survivor", _top_survivor)
