"""Reward schemes, selected by name: from what happened in an episode to one reward per policy step.

An :class:`Episode` records the outcome and, for each retrieval step, the judge's relevance of
the documents it brought back. A scheme turns it into per-step rewards aligned with the policy's
steps (each retrieval step, then the final answer or the step that broke the format); their sum
is the scalar episode reward.

``r3`` is R3-RAG's scheme (spec section 3, the official constants, all configurable): process
rewards (relevance) scaled by the outcome, plus the answer step's reward. ``outcome`` is the
ablation without process rewards: the same answer and format terms, no relevance.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass


class Outcome(str, enum.Enum):
    CORRECT = "correct"
    WRONG = "wrong"
    NO_ANSWER = "no_answer"  # max_steps reached without an answer
    FORMAT_ERROR = "format_error"  # a step did not parse; the episode ended there


@dataclass(frozen=True)
class Episode:
    """What a scheme needs: the outcome and one relevance score in [0, 1] per retrieval step.

    The policy's steps are the retrieval steps, then (unless the outcome is NO_ANSWER) one
    final step: the answer, or the step that broke the format.
    """

    outcome: Outcome
    relevance: Sequence[float] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.outcome, Outcome):
            object.__setattr__(self, "outcome", Outcome(self.outcome))
        if any(not 0.0 <= r <= 1.0 for r in self.relevance):
            raise ValueError(f"relevance scores must lie in [0, 1], got {list(self.relevance)}")
        if self.outcome is Outcome.NO_ANSWER and not self.relevance:
            raise ValueError("a no-answer episode has at least one retrieval step")

    @property
    def num_steps(self) -> int:
        return len(self.relevance) + (self.outcome is not Outcome.NO_ANSWER)


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

    def scale(self, outcome: Outcome) -> float:
        return {
            Outcome.CORRECT: self.correct_scale,
            Outcome.WRONG: self.wrong_scale,
            Outcome.NO_ANSWER: self.no_answer_scale,
            Outcome.FORMAT_ERROR: self.format_error_scale,
        }[outcome]

    def final_reward(self, outcome: Outcome) -> float:
        return {
            Outcome.CORRECT: self.correct_answer_reward,
            Outcome.WRONG: self.wrong_answer_reward,
            Outcome.FORMAT_ERROR: self.format_error_reward,
        }[outcome]


def r3_step_rewards(episode: Episode, config: R3RewardConfig | None = None) -> list[float]:
    """Per-step rewards of R3-RAG's scheme."""
    config = config or R3RewardConfig()
    scale = config.scale(episode.outcome) if config.process_rewards else 0.0
    rewards = [relevance * scale for relevance in episode.relevance]
    if episode.outcome is not Outcome.NO_ANSWER:
        rewards.append(config.final_reward(episode.outcome))
    return rewards


@dataclass(frozen=True)
class RewardScheme:
    """A named scheme: ``step_rewards(episode)`` and whether it needs the relevance judge."""

    name: str
    step_rewards: Callable[[Episode], list[float]]
    needs_relevance: bool


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
    return factory(**options)


def _r3(**options) -> RewardScheme:
    config = R3RewardConfig(**options)
    return RewardScheme("r3", lambda episode: r3_step_rewards(episode, config), needs_relevance=config.process_rewards)


def _outcome(**options) -> RewardScheme:
    config = R3RewardConfig(**{**options, "process_rewards": False})
    return RewardScheme("outcome", lambda episode: r3_step_rewards(episode, config), needs_relevance=False)


register_scheme("r3", _r3)
register_scheme("outcome", _outcome)
