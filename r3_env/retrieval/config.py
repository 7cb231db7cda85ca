"""Retriever settings, with FlashRAG's key names so a FlashRAG config block works unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field

# FlashRAG retriever settings r3rag accepts in a config and ignores: its retrieval cache (the
# service has its own LRU), its reranker, and pipeline keys. The official R3-RAG config sets some.
FLASHRAG_IGNORED_KEYS = frozenset(
    {
        "save_retrieval_cache",
        "use_retrieval_cache",
        "retrieval_cache_path",
        "use_reranker",
        "rerank_model_name",
        "rerank_model_path",
        "rerank_topk",
        "rerank_max_length",
        "rerank_batch_size",
        "rerank_use_fp16",
        "save_dir",
        "dataset_name",
        "silent_retrieval",
        "use_multi_retriever",
        "multi_retriever_setting",
        "gpu_id",
        "device_map",
    }
)

DENSE_DEFAULT_INSTRUCTIONS = {
    # (query, passage) prefixes the model families were trained with, as FlashRAG sets them.
    "e5": ("query: ", "passage: "),
    "bge": ("Represent this sentence for searching relevant passages: ", ""),
}


def default_instructions(retrieval_method: str) -> tuple[str, str]:
    """The (query, passage) instruction prefixes for a model name (empty for unknown families)."""
    name = retrieval_method.lower()
    for family, prefixes in DENSE_DEFAULT_INSTRUCTIONS.items():
        if family in name:
            return prefixes
    return "", ""


def instruction_prefix(instruction: str | None, retrieval_method: str, passage: bool) -> str:
    """The prefix put before each query (or passage): the given instruction, else the model family's."""
    if instruction is None:
        return default_instructions(retrieval_method)[1 if passage else 0]
    return instruction.strip() + " " if instruction.strip() else ""


@dataclass(frozen=True)
class RetrieverConfig:
    """How to load and query one retriever.

    ``retrieval_method``: "bm25", "hybrid" (BM25 and dense fused by reciprocal rank), or the
    name of a dense encoder ("e5", "bge", "minilm", ...; the name picks E5/BGE instructions).
    ``index_path``: the bm25s index folder for BM25, the faiss index file for dense (and for
    hybrid, whose BM25 side is ``bm25_index_path``), or a sharded index's manifest
    (``*.shards.json``, from ``r3rag index shard``), whose shards Ray actors hold.
    """

    retrieval_method: str = field(default="bm25", metadata={"help": "bm25, hybrid, or a dense encoder name"})
    index_path: str = field(default="", metadata={"help": "bm25s index folder, or faiss index file"})
    corpus_path: str = field(default="", metadata={"help": "the corpus .jsonl the index was built from"})
    retrieval_topk: int = field(default=5, metadata={"help": "documents per query when a request names none"})
    retrieval_model_path: str = field(default="", metadata={"help": "dense encoder: hub name or local folder"})
    retrieval_pooling_method: str = field(default="mean", metadata={"help": "dense pooling: mean, cls or pooler"})
    retrieval_query_max_length: int = field(default=256, metadata={"help": "dense query tokens"})
    retrieval_use_fp16: bool = field(default=False, metadata={"help": "fp16 encoder (GPU only)"})
    retrieval_batch_size: int = field(default=128, metadata={"help": "dense encoder batch size"})
    instruction: str | None = field(default=None, metadata={"help": "query prefix (default: by model family)"})
    use_sentence_transformer: bool = field(
        default=False, metadata={"help": "load the encoder with sentence-transformers"}
    )
    faiss_gpu: bool = field(default=False, metadata={"help": "put the faiss index on the GPUs"})
    faiss_nprobe: int = field(default=32, metadata={"help": "IVF indexes: clusters searched per query"})
    shard_num_cpus: float = field(
        default=1.0, metadata={"help": "sharded index (index_path *.shards.json): CPUs each shard's Ray actor reserves"}
    )
    device: str = field(default="auto", metadata={"help": "encoder device: auto, cpu, cuda"})
    bm25_backend: str = field(default="bm25s", metadata={"help": "bm25s, or pyserini (needs Java 21+)"})
    bm25_index_path: str = field(default="", metadata={"help": "hybrid: the BM25 side's index folder"})
    dense_method: str = field(default="", metadata={"help": "hybrid: the dense side's encoder name (e5, bge, ...)"})
    rrf_k: int = field(default=60, metadata={"help": "hybrid: reciprocal-rank-fusion constant"})
    hybrid_depth: int = field(default=50, metadata={"help": "hybrid: documents each side contributes"})

    def __post_init__(self) -> None:
        if not self.index_path:
            raise ValueError("index_path is required: the bm25s index folder or the faiss index file")
        if self.retrieval_method != "bm25" and not self.corpus_path:
            raise ValueError(f"corpus_path is required for retrieval_method {self.retrieval_method!r}")
        if self.retrieval_method == "hybrid" and not (self.bm25_index_path and self.dense_method):
            raise ValueError(
                "retrieval_method 'hybrid' needs bm25_index_path (the BM25 side) and dense_method "
                "(the dense side's encoder name, e.g. e5)"
            )
        if self.retrieval_method not in ("bm25",) and not self.retrieval_model_path:
            raise ValueError(f"retrieval_model_path is required for dense method {self.retrieval_method!r}")
        if self.retrieval_pooling_method not in ("mean", "cls", "pooler"):
            raise ValueError(
                f"retrieval_pooling_method must be mean, cls or pooler, got {self.retrieval_pooling_method!r}"
            )
        if self.shard_num_cpus < 0:
            raise ValueError(f"shard_num_cpus must be 0 or more, got {self.shard_num_cpus}")
        if self.bm25_backend not in ("bm25s", "pyserini"):
            raise ValueError(f"bm25_backend must be bm25s or pyserini, got {self.bm25_backend!r}")
        for name in (
            "retrieval_topk",
            "retrieval_batch_size",
            "retrieval_query_max_length",
            "rrf_k",
            "hybrid_depth",
            "faiss_nprobe",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    @property
    def encoder_name(self) -> str:
        """The dense encoder's family name (hybrid's dense side included)."""
        return self.dense_method if self.retrieval_method == "hybrid" else self.retrieval_method

    def query_instruction(self) -> str:
        return instruction_prefix(self.instruction, self.encoder_name, passage=False)
