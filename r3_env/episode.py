"""A finished episode as the reward schemes see it, built in one place for the rollout and the reward server.

The rollout (:func:`r3_env.rollout.run_episode`) and the reward server (``reward_server.scoring``)
both end an episode the same way: :func:`classify` decides its :class:`Outcome` from the last step,
and :func:`build_episode` makes the :class:`Episode` a scheme scores, computing from the
:class:`Trace` every signal the scheme declares. A scheme that needs a new signal of the episode
declares it with the function that computes it (``RewardScheme.signals``); neither caller changes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from r3_env.protocol import Step

if TYPE_CHECKING:
    from r3_env.rewards import RewardScheme


class Outcome(str, enum.Enum):
    """How an episode ended. A ``str`` enum: logs and JSON records hold the values."""

    CORRECT = "correct"
    WRONG = "wrong"
    NO_ANSWER = "no_answer"  # the episode ended after a retrieval step: max_steps, or a stop signal with queries
    STOPPED = "stopped"  # multi_query: a final step that only signals stop (the steering model never answers)
    FORMAT_ERROR = "format_error"  # a step did not parse; the episode ended there
    # Neutral outcomes: the episode is not scored, every step gets 0.
    SERVICE_FAILURE = "service_failure"  # the retrieval service or the judge failed for good
    LABEL_PROBLEM = "label_problem"  # the label lacks what the scheme needs (golden answers, gold ids)
    UNREADABLE = "unreadable"  # the reward server could not read the transcript back into steps

    @property
    def scored(self) -> bool:
        """A scheme scores the episode (the neutral outcomes get 0 on every step)."""
        return self in SCORED_OUTCOMES

    @property
    def log_key(self) -> str:
        """Its flag in a rollout's extra_logs: ``outcome_<value>`` for a scored outcome, the value for a neutral one."""
        return f"outcome_{self.value}" if self.scored else self.value


SCORED_OUTCOMES = (Outcome.CORRECT, Outcome.WRONG, Outcome.NO_ANSWER, Outcome.STOPPED, Outcome.FORMAT_ERROR)
ROLLOUT_OUTCOMES = (*SCORED_OUTCOMES, Outcome.SERVICE_FAILURE, Outcome.LABEL_PROBLEM)  # what run_episode may return


def classify(format_error: str | None, last_step: Step | None, correct: bool = False) -> Outcome:
    """The outcome of an episode whose last well-formed step is ``last_step``.

    ``format_error``: why the step after it did not parse (it ended the episode); ``correct``: the
    answer's verdict, when there is an answer and the scheme checks it (unchecked answers count as wrong).
    """
    if format_error is not None:
        return Outcome.FORMAT_ERROR
    if last_step is None or not last_step.is_final:
        return Outcome.NO_ANSWER
    if last_step.answer is None:
        return Outcome.STOPPED
    return Outcome.CORRECT if correct else Outcome.WRONG


@dataclass(frozen=True)
class Trace:
    """What both the rollout and the reward server know of a finished episode: the input of every signal."""

    question: str
    golden_answers: Sequence[str]
    steps: Sequence[Step]  # the well-formed steps, in order: retrieval steps, then a final one if any
    format_error: str | None = None  # the step after ``steps`` did not parse
    documents: Sequence[Sequence[str]] = ()  # per retrieval step, the contents of the documents it brought back

    @property
    def retrieval_steps(self) -> list[Step]:
        return [step for step in self.steps if not step.is_final]

    @property
    def last_step(self) -> Step | None:
        """The step the episode ended on (None when none was written, or the one after it broke the format)."""
        return self.steps[-1] if self.steps and self.format_error is None else None

    @property
    def answer(self) -> str | None:
        return self.last_step.answer if self.last_step is not None else None


# A signal: one value computed from a finished episode's trace, put in Episode.signals under its name.
Signal = Callable[[Trace], Any]


@dataclass(frozen=True)
class BranchHit:
    """One query of a multi_query step: is its top-1 document gold, and seen for the first time?"""

    gold: bool
    new: bool = False  # not in the starting context, nor found by an earlier query or step
    predicted: bool = False  # an anticipatory query (R2AG's predicted-Q), not a base one


@dataclass(frozen=True)
class Episode:
    """What a scheme needs to know about one finished episode.

    The policy's steps are the retrieval steps, then (unless the outcome is NO_ANSWER) one
    final step: the answer, or the step that broke the format. ``relevance`` has one score in
    [0, 1] per retrieval step (zeros when the scheme asked for no judge), so its length is the
    number of retrievals. The other fields are filled when a scheme needs them: ``new_gold``
    (per retrieval step, gold passages not retrieved before) and ``gold_total`` for
    ``gold_hit``; ``queries``, ``query_similarity`` (mean pairwise cosine of the query
    embeddings) and ``training_step`` for ``lws``; ``branches`` (per retrieval step, each query's
    top-1 hit), ``gold_before`` (gold passages in the episode's starting context) and
    ``stopped`` (the last step signalled stop) for ``top_survivor``; ``signals`` holds the values
    of the signals the scheme declares (``RewardScheme.signals``), by name.
    """

    outcome: Outcome
    relevance: Sequence[float] = ()
    new_gold: Sequence[int] = ()
    gold_total: int = 0
    queries: Sequence[str] = ()
    query_similarity: float | None = None
    training_step: int = 0
    branches: Sequence[Sequence[BranchHit]] = ()
    gold_before: int = 0
    stopped: bool = False
    signals: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.outcome, Outcome):
            object.__setattr__(self, "outcome", Outcome(self.outcome))
        if not self.outcome.scored:
            raise ValueError(f"a {self.outcome.value} episode is not scored: every step gets 0")
        if any(not 0.0 <= r <= 1.0 for r in self.relevance):
            raise ValueError(f"relevance scores must lie in [0, 1], got {list(self.relevance)}")
        if self.outcome is Outcome.NO_ANSWER and not self.relevance:
            raise ValueError("a no-answer episode has at least one retrieval step")
        for name in ("new_gold", "queries", "branches"):
            values = getattr(self, name)
            if values and len(values) != len(self.relevance):
                raise ValueError(f"{name} has {len(values)} entries for {len(self.relevance)} retrieval steps")
        if self.gold_before + sum(self.new_gold) > self.gold_total:
            raise ValueError(
                f"gold_before={self.gold_before} plus new_gold {list(self.new_gold)} is more than "
                f"gold_total={self.gold_total}"
            )

    @property
    def retrievals(self) -> int:
        return len(self.relevance)

    @property
    def num_steps(self) -> int:
        return self.retrievals + (self.outcome is not Outcome.NO_ANSWER)


@dataclass(frozen=True)
class GoldProgress:
    """The gold passages an episode found, for the schemes that need them (``RewardScheme.needs_gold``)."""

    total: int  # gold passages of the question
    before: int = 0  # already in the starting context
    new: Sequence[int] = ()  # per retrieval step, gold passages not found before
    branches: Sequence[Sequence[BranchHit]] = ()  # per retrieval step, each query's top-1 hit


def build_episode(
    scheme: RewardScheme,
    outcome: Outcome,
    trace: Trace,
    relevance: Sequence[float],
    gold: GoldProgress | None = None,
    query_similarity: float | None = None,
    training_step: int = 0,
) -> Episode:
    """The episode ``scheme`` scores: the caller's judgements and counts, and the signals the scheme declares."""
    retrievals, last = trace.retrieval_steps, trace.last_step
    return Episode(
        outcome,
        relevance,
        new_gold=gold.new if gold is not None and scheme.needs_gold else (),
        gold_total=gold.total if gold is not None else 0,
        queries=[step.query or "; ".join(step.queries + step.predicted) for step in retrievals],
        query_similarity=query_similarity,
        training_step=training_step,
        branches=gold.branches if gold is not None and scheme.needs_gold else (),
        gold_before=gold.before if gold is not None else 0,
        stopped=last is not None and last.stop,
        signals={name: compute(trace) for name, compute in scheme.signals.items()},
    )
