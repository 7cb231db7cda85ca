"""The judge interface: batched relevance and correctness, every result saying which backend gave it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class RelevanceItem:
    question: str
    query: str
    documents: Sequence[str]
    analysis: str = ""


@dataclass(frozen=True)
class CorrectnessItem:
    question: str
    prediction: str
    golden_answers: Sequence[str]


@dataclass(frozen=True)
class JudgeResult:
    """One judgement. ``fallback`` marks a configured value used because the judge failed (``reason``)."""

    score: float
    backend: str
    fallback: bool = False
    reason: str = ""
    analysis: str = ""
    cached: bool = False
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


class Judge(ABC):
    """Scores batches of items; never raises for a judge failure (results are flagged instead)."""

    backend: str

    @abstractmethod
    async def relevance(self, items: Sequence[RelevanceItem]) -> list[JudgeResult]:
        """A score in [0, 1] per item."""

    @abstractmethod
    async def correctness(self, items: Sequence[CorrectnessItem]) -> list[JudgeResult]:
        """1.0 (correct) or 0.0 per item."""

    async def status(self) -> dict:
        """Whether the judge can be reached (reported by /health)."""
        return {"reachable": True}

    async def close(self) -> None:  # noqa: B027 - judges without connections have nothing to close
        """Release connections and models."""
