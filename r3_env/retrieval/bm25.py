"""BM25 with bm25s (FlashRAG's ``bm25_backend: bm25s``), in memory or in FlashRAG's on-disk layout.

Tokenisation: lowercase words of two or more characters, English stopwords removed, Snowball
English stemming, the same for passages and queries; with it, FlashRAG's own ``BM25Retriever``
ranks an index built here exactly as :class:`BM25Retriever` does (tested).

On disk (``{save_dir}/bm25/``): the bm25s matrices and params, ``vocab.tokenizer.json`` and
``stopwords.tokenizer.json`` (what current FlashRAG loads), and by default the corpus copy that
bm25s keeps (what flashrag-dev 0.1.2 loads).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from r3_env.data import Passage, iter_corpus
from r3_env.retrieval.base import Hit, Retriever, check_k
from r3_env.retrieval.docstore import DocStore

logger = logging.getLogger(__name__)

CHUNK = 50_000  # passages tokenised per progress update


class IndexFormatError(ValueError):
    """An index folder or file that cannot be served; the message says how to rebuild it."""


def _bm25s():
    # Where JAX is installed, bm25s runs a JAX top-k when it is imported, and JAX's first use on a GPU machine
    # takes 75% of the GPU's memory: every process that imports bm25s (the demo, the retrieval service) did,
    # and the policy then ran out of memory on an H100. bm25s's top-k needs no GPU, so JAX stays on the CPU
    # unless the user chose its platforms. JAX reads the variable when it is imported (child processes inherit
    # it), so a JAX imported before this point gets the setting through its config.
    if "JAX_PLATFORMS" not in os.environ:
        os.environ["JAX_PLATFORMS"] = "cpu"
        if "jax" in sys.modules:
            sys.modules["jax"].config.update("jax_platforms", "cpu")
    import bm25s
    import Stemmer

    logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs every index build at DEBUG
    return bm25s, Stemmer.Stemmer("english")


def _backend() -> str:
    try:
        import numba  # noqa: F401
    except ImportError:
        return "numpy"
    return "numba"


def tokenize_queries(queries: Sequence[str]) -> list[list[str]]:
    bm25s, stemmer = _bm25s()
    return bm25s.tokenize(list(queries), stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False)


def build_bm25(passages: Iterable[Passage], k1: float = 1.5, b: float = 0.75, backend: str | None = None):
    """(bm25s model, tokenizer, passages) for a stream of passages, logging progress in docs/s.

    ``backend``: bm25s's scoring backend; numba (the default when installed, as FlashRAG uses)
    is several times faster per query but compiles for a few seconds on its first search.
    """
    bm25s, stemmer = _bm25s()
    tokenizer = bm25s.tokenization.Tokenizer(stopwords="en", stemmer=stemmer)
    docs: list[Passage] = []
    ids: list[list[int]] = []
    started = time.perf_counter()
    batch: list[Passage] = []

    def flush() -> None:
        ids.extend(tokenizer.tokenize([p.contents for p in batch], return_as="ids", show_progress=False))
        docs.extend(batch)
        batch.clear()
        rate = len(docs) / max(time.perf_counter() - started, 1e-9)
        logger.info("bm25: tokenised %d passages (%.0f docs/s)", len(docs), rate)

    for passage in passages:
        batch.append(passage)
        if len(batch) == CHUNK:
            flush()
    if batch:
        flush()
    if not docs:
        raise ValueError("cannot build a BM25 index over an empty corpus")
    model = bm25s.BM25(k1=k1, b=b, backend=backend or _backend())
    model.index(bm25s.tokenization.Tokenized(ids=ids, vocab=tokenizer.get_vocab_dict()), show_progress=False)
    logger.info("bm25: indexed %d passages in %.1f s", len(docs), time.perf_counter() - started)
    return model, tokenizer, docs


def build_bm25_index(corpus_path: str | Path, save_dir: str | Path, save_corpus: bool = True) -> Path:
    """Build ``{save_dir}/bm25`` from a corpus file, FlashRAG's layout; returns the folder."""
    folder = Path(save_dir) / "bm25"
    model, tokenizer, docs = build_bm25(iter_corpus(corpus_path))
    folder.mkdir(parents=True, exist_ok=True)
    model.save(str(folder), corpus=[p.to_json() for p in docs] if save_corpus else None, show_progress=False)
    tokenizer.save_vocab(str(folder))
    tokenizer.save_stopwords(str(folder))
    logger.info("bm25: saved %s", folder)
    return folder


class BM25Retriever(Retriever):
    """BM25 search over an in-memory or saved bm25s index."""

    def __init__(self, model, docs: DocStore | Sequence[Passage]) -> None:
        self._model = model
        self._docs = docs
        self._count = len(docs)

    @classmethod
    def from_passages(cls, passages: Iterable[Passage], backend: str = "numpy") -> BM25Retriever:
        """An in-memory index (numpy scoring by default: no compile time for one-off checks)."""
        model, _, docs = build_bm25(passages, backend=backend)
        return cls(model, docs)

    @classmethod
    def load(cls, index_path: str | Path, corpus_path: str | Path | None = None) -> BM25Retriever:
        bm25s, _ = _bm25s()
        folder = Path(index_path)
        if not (folder / "params.index.json").is_file():
            raise IndexFormatError(
                f"index_path {folder} is not a bm25s index folder (no params.index.json); build one with "
                "`r3rag index build --retrieval_method bm25 --corpus_path CORPUS --save_dir DIR` and point "
                "index_path at DIR/bm25"
            )
        _reject_character_vocabulary(folder)
        corpus = Path(corpus_path) if corpus_path else folder / "corpus.jsonl"
        if not corpus.is_file():
            raise FileNotFoundError(
                f"no corpus for the BM25 index {folder}: set corpus_path to the corpus .jsonl it was built from"
            )
        model = bm25s.BM25.load(str(folder), mmap=True, load_corpus=False)
        model.backend = _backend()
        model.retrieve([["warmup"]], k=1, show_progress=False)  # numba compiles now, not on the first request
        docs = DocStore(corpus, cache_dir=folder)
        if model.scores["num_docs"] != len(docs):
            raise IndexFormatError(
                f"the BM25 index {folder} holds {model.scores['num_docs']} documents but "
                f"{corpus} has {len(docs)} rows: give the corpus the index was built from"
            )
        return cls(model, docs)

    def __len__(self) -> int:
        return self._count

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_k(k)
        if not queries:
            return []
        tokens = tokenize_queries(queries)
        asked = [i for i, words in enumerate(tokens) if words]  # a query of stopwords alone matches nothing
        results: list[list[Hit]] = [[] for _ in queries]
        if not asked:
            return results
        rows, scores = self._model.retrieve([tokens[i] for i in asked], k=min(k, self._count), show_progress=False)
        get = self._docs.row if isinstance(self._docs, DocStore) else self._docs.__getitem__
        for index, row, row_scores in zip(asked, rows, scores, strict=True):
            results[index] = [Hit(get(int(i)), float(s)) for i, s in zip(row, row_scores, strict=True)]
        return results

    def close(self) -> None:
        if isinstance(self._docs, DocStore):
            self._docs.close()


def _reject_character_vocabulary(folder: Path) -> None:
    """flashrag-dev 0.1.2's index_builder hands bm25s raw strings, which it indexes as characters."""
    vocab_file = folder / "vocab.index.json"
    if not vocab_file.is_file():
        return
    vocab = json.loads(vocab_file.read_text())
    if vocab and all(len(token) <= 1 for token in vocab):
        raise IndexFormatError(
            f"the BM25 index {folder} has a vocabulary of {len(vocab)} single characters, not words: it was "
            "built by flashrag-dev 0.1.2's index_builder, which indexes characters. Rebuild it with "
            "`r3rag index build --retrieval_method bm25 --corpus_path CORPUS --save_dir DIR`"
        )
