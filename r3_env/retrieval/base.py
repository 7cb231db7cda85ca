"""The one interface every retriever and the retrieval client share: batched ``search``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from r3_env.data import Passage


@dataclass(frozen=True)
class Hit:
    """One retrieved passage and its score (higher is better; scales differ between retrievers)."""

    passage: Passage
    score: float

    def to_json(self) -> dict[str, Any]:
        """Search-R1's shape: ``{"document": {"id", "contents"}, "score": s}``."""
        return {"document": self.passage.to_json(), "score": self.score}


class Retriever(ABC):
    """Batched top-k retrieval. In-process retrievers and the HTTP client both implement it."""

    @abstractmethod
    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """The top ``k`` hits of each query, best first."""

    def close(self) -> None:  # noqa: B027 - most retrievers hold nothing to release
        """Release files and models."""

    def __enter__(self) -> Retriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
