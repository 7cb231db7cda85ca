"""In-memory BM25 over passages with bm25s (FlashRAG's ``bm25_backend: bm25s``).

Tokenisation: lowercase words of two or more characters, English stopwords removed, Snowball
English stemming, applied identically to passages and queries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

from r3_env.data import Passage

logger = logging.getLogger(__name__)


class BM25Index:
    """BM25 over a list of passages; ``search`` returns ranked (passage id, score) lists."""

    def __init__(self, passages: Iterable[Passage], k1: float = 1.5, b: float = 0.75) -> None:
        import bm25s
        import Stemmer

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs every index build at DEBUG
        self._bm25s = bm25s
        self._stemmer = Stemmer.Stemmer("english")
        started = time.perf_counter()
        self.ids: list[str] = []
        texts: list[str] = []
        for passage in passages:
            self.ids.append(passage.id)
            texts.append(passage.contents)
        if not texts:
            raise ValueError("cannot build a BM25 index over an empty corpus")
        tokens = self._tokenize(texts)
        self._retriever = bm25s.BM25(k1=k1, b=b)
        self._retriever.index(tokens, show_progress=False)
        logger.info("BM25 index over %d passages built in %.1f s", len(texts), time.perf_counter() - started)

    def _tokenize(self, texts: Sequence[str]) -> list[list[str]]:
        return self._bm25s.tokenize(
            list(texts), stopwords="en", stemmer=self._stemmer, return_ids=False, show_progress=False
        )

    def __len__(self) -> int:
        return len(self.ids)

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[str, float]]]:
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        if not queries:
            return []
        k = min(k, len(self.ids))
        rows, scores = self._retriever.retrieve(self._tokenize(queries), k=k, show_progress=False)
        return [
            [(self.ids[int(i)], float(s)) for i, s in zip(row, row_scores, strict=True)]
            for row, row_scores in zip(rows, scores, strict=True)
        ]
