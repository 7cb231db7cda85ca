"""Hybrid retrieval: BM25 and dense results fused by reciprocal rank (Cormack et al., 2009)."""

from __future__ import annotations

from collections.abc import Sequence

from r3_env.retrieval.base import Hit, Retriever, check_k


def reciprocal_rank_fusion(rankings: Sequence[Sequence[Hit]], k: int, rrf_k: int = 60) -> list[Hit]:
    """Merge ranked lists: each passage scores the sum of 1 / (rrf_k + rank) over the lists it is in.

    Ties keep the order of first appearance (the first list wins), so the fusion is deterministic.
    """
    scores: dict[str, float] = {}
    passages = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking, start=1):
            scores[hit.passage.id] = scores.get(hit.passage.id, 0.0) + 1.0 / (rrf_k + rank)
            passages.setdefault(hit.passage.id, hit.passage)
    order = sorted(scores, key=lambda pid: -scores[pid])  # sorted() is stable: first appearance breaks ties
    return [Hit(passages[pid], scores[pid]) for pid in order[:k]]


class HybridRetriever(Retriever):
    """Queries both retrievers ``depth`` deep and fuses their rankings."""

    def __init__(self, sparse: Retriever, dense: Retriever, rrf_k: int = 60, depth: int = 50) -> None:
        self.sparse, self.dense, self.rrf_k, self.depth = sparse, dense, rrf_k, depth

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_k(k)
        depth = max(k, self.depth)
        sparse, dense = self.sparse.search(queries, depth), self.dense.search(queries, depth)
        return [reciprocal_rank_fusion([s, d], k, self.rrf_k) for s, d in zip(sparse, dense, strict=True)]

    def close(self) -> None:
        self.sparse.close()
        self.dense.close()
