"""The dense judge: relevance from a sentence encoder and the documents' titles, no generative model.

Built for CPU, where a small chat model cannot grade relevance (SmolLM2-135M scores gold
passages at chance, whether its prose is parsed or its "Yes" probability is read) and the
lexical judge is fooled by distractors chosen to share the question's words. Two signals, each
in [0, 1] after clipping, mixed with ``dense_weight``:

* **best sentence**: the highest cosine similarity between the query and one sentence of a
  document (each sentence prefixed with the document's title, so a sentence that names its
  subject only through the title still matches). A whole-passage embedding dilutes the one
  sentence that holds the fact.
* **title match**: the share of the document title's content words that the query contains.
  Multi-hop questions name the entities whose pages hold their first hop; distractors share
  words with the question but are about other entities.

A document scores ``(1 - question_weight) * f(query) + question_weight * f(question)``, as the
lexical judge weighs the two, and an item scores its best document: one document that supplies
the missing piece is enough. Measured by ``bench/judge_quality.py``. Correctness uses the
lexical judge's rules (containment, reordered words, token F1), which are exact on short answers.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from r3_env.answers import normalize_answer
from reward_server.judges.base import CorrectnessItem, Judge, JudgeResult, RelevanceItem
from reward_server.judges.lexical import _STOPWORDS, LexicalJudge

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_document(document: str, max_sentences: int) -> tuple[str, list[str]]:
    """(title, its first ``max_sentences`` sentences); FlashRAG passages are "Title\\ntext"."""
    title, _, body = document.partition("\n")
    if not body:
        title, body = "", title
    sentences = [s for s in _SENTENCE_END.split(body.strip()) if s.strip()][:max_sentences] or [body.strip()]
    return title.strip(), sentences


def title_match(title: str, text: str) -> float:
    """Share of the title's content words found in ``text`` (0 for a document without a title)."""
    words = [w for w in normalize_answer(title).split() if w not in _STOPWORDS]
    if not words:
        return 0.0
    haystack = f" {normalize_answer(text)} "
    return sum(f" {word} " in haystack for word in words) / len(words)


class _EmbeddingCache:
    """Embeddings by text, least recently used dropped first: rollouts see the same documents often."""

    def __init__(self, size: int) -> None:
        self.size, self.vectors = size, OrderedDict()

    def get(self, text: str) -> np.ndarray | None:
        vector = self.vectors.get(text)
        if vector is not None:
            self.vectors.move_to_end(text)
        return vector

    def put(self, text: str, vector: np.ndarray) -> None:
        self.vectors[text] = vector
        if len(self.vectors) > self.size:
            self.vectors.popitem(last=False)


class DenseJudge(Judge):
    backend = "dense"

    def __init__(
        self,
        encoder_path: str,
        device: str = "cpu",
        dense_weight: float = 0.7,
        question_weight: float = 0.3,
        max_sentences: int = 8,
        snap_to_tenths: bool = False,
        cache_size: int = 100_000,
    ) -> None:
        from sentence_transformers import SentenceTransformer

        from r3_env.retrieval.encoder import resolve_device

        self.model = SentenceTransformer(encoder_path, device=resolve_device(device))
        self.encoder_path = encoder_path
        self.dense_weight, self.question_weight = dense_weight, question_weight
        self.max_sentences, self.snap_to_tenths = max_sentences, snap_to_tenths
        self.cache = _EmbeddingCache(cache_size)
        self.lexical = LexicalJudge()
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Normalised embeddings, one row per text, encoding only texts not seen recently."""
        found = {t: v for t in dict.fromkeys(texts) if (v := self.cache.get(t)) is not None}
        missing = [t for t in dict.fromkeys(texts) if t not in found]
        if missing:
            vectors = self.model.encode(
                missing, batch_size=64, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
            )
            for text, vector in zip(missing, vectors, strict=True):
                found[text] = vector.astype(np.float32)
                self.cache.put(text, found[text])  # a batch larger than the cache may evict its own texts
        return np.stack([found[t] for t in texts]) if texts else np.zeros((0, 0), np.float32)

    def text_score(self, similarity: float, title: str, text: str) -> float:
        dense = min(max(similarity, 0.0), 1.0)
        return self.dense_weight * dense + (1 - self.dense_weight) * title_match(title, text)

    def relevance_scores(self, items: Sequence[RelevanceItem]) -> list[float]:
        """One score per item: its best document under the mixed query and question score."""
        documents = [[split_document(doc, self.max_sentences) for doc in item.documents] for item in items]
        sentences = [f"{title}: {s}" if title else s for docs in documents for title, ss in docs for s in ss]
        queries = [text for item in items for text in (item.query, item.question)]
        with self._lock:
            sentence_vectors = self.encode(sentences)
            query_vectors = self.encode(queries)
        scores, row = [], 0
        for number, (item, docs) in enumerate(zip(items, documents, strict=True)):
            query, question = query_vectors[2 * number], query_vectors[2 * number + 1]
            best = 0.0
            for title, doc_sentences in docs:
                block = sentence_vectors[row : row + len(doc_sentences)]
                row += len(doc_sentences)
                by_query = self.text_score(float((block @ query).max()), title, item.query)
                by_question = self.text_score(float((block @ question).max()), title, item.question)
                best = max(best, (1 - self.question_weight) * by_query + self.question_weight * by_question)
            scores.append(round(best * 10) / 10 if self.snap_to_tenths else round(best, 4))
        return scores

    async def relevance(self, items: Sequence[RelevanceItem]) -> list[JudgeResult]:
        scores = await asyncio.to_thread(self.relevance_scores, items)
        return [JudgeResult(score, self.backend) for score in scores]

    async def correctness(self, items: Sequence[CorrectnessItem]) -> list[JudgeResult]:
        return [JudgeResult(float(self.lexical.correct(item)), self.backend) for item in items]

    async def status(self) -> dict:
        return {"reachable": True, "encoder": self.encoder_path}
