"""Retrieval: FlashRAG-compatible indexes, in-process retrievers, the batched service and its client.

Everything answers one call, ``search(queries, k) -> list[list[Hit]]``. The environment and
evaluation use :func:`open_retriever`: with a URL they get the HTTP client, without one the
same retriever the service would load, in their own process (tests, the demo, notebooks).
"""

from __future__ import annotations

from r3_env.retrieval.base import Hit, Retriever
from r3_env.retrieval.config import RetrieverConfig


def _sparse(config: RetrieverConfig, index_path: str) -> Retriever:
    if config.bm25_backend == "pyserini":
        from r3_env.retrieval.pyserini import PyseriniRetriever

        return PyseriniRetriever(index_path, config.corpus_path or None)
    from r3_env.retrieval.bm25 import BM25Retriever

    return BM25Retriever.load(index_path, config.corpus_path or None)


def load_retriever(config: RetrieverConfig) -> Retriever:
    """The in-process retriever a config describes (BM25, dense or hybrid)."""
    if config.retrieval_method == "bm25":
        return _sparse(config, config.index_path)
    from r3_env.retrieval.dense import DenseRetriever

    dense = DenseRetriever(config)
    if config.retrieval_method != "hybrid":
        return dense
    from r3_env.retrieval.hybrid import HybridRetriever

    return HybridRetriever(_sparse(config, config.bm25_index_path), dense, config.rrf_k, config.hybrid_depth)


def open_retriever(url: str | None = None, config: RetrieverConfig | None = None, **client_options) -> Retriever:
    """The retrieval client for ``url``, or the in-process retriever of ``config`` when no URL is given."""
    if url:
        from r3_env.retrieval.client import RetrievalClient

        return RetrievalClient(url, **client_options)
    if config is None:
        raise ValueError("give a retrieval service url, or a RetrieverConfig to retrieve in-process")
    return load_retriever(config)


def open_async_retriever(url: str | None = None, config: RetrieverConfig | None = None, **client_options):
    """The async twin of :func:`open_retriever`: the async client, or an in-process retriever in a thread."""
    from r3_env.retrieval.client import AsyncInProcess, AsyncRetrievalClient

    if url:
        return AsyncRetrievalClient(url, **client_options)
    if config is None:
        raise ValueError("give a retrieval service url, or a RetrieverConfig to retrieve in-process")
    return AsyncInProcess(load_retriever(config))


__all__ = ["Hit", "Retriever", "RetrieverConfig", "load_retriever", "open_async_retriever", "open_retriever"]
