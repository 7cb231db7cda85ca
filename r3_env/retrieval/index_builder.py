"""``r3rag index build``: FlashRAG-compatible indexes from a corpus file.

Option names follow ``python -m flashrag.retriever.index_builder``. BM25 lands in
``{save_dir}/bm25/``; a dense index in ``{save_dir}/{method}_{faiss_type}.index`` with its
embeddings in ``{save_dir}/emb_{method}.memmap``, which a later build with another
``faiss_type`` reuses instead of encoding again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class IndexBuildConfig:
    retrieval_method: str = field(default="bm25", metadata={"help": "bm25, or a dense encoder name (e5, bge, ...)"})
    corpus_path: str = field(default="", metadata={"help": "corpus .jsonl ({id, contents})"})
    save_dir: str = field(default="indexes", metadata={"help": "output folder"})
    model_path: str = field(default="", metadata={"help": "dense: encoder folder or hub name"})
    bm25_backend: str = field(default="bm25s", metadata={"help": "bm25s, or pyserini (Java 21+)"})
    bm25_save_corpus: bool = field(
        default=True, metadata={"help": "bm25s: keep a corpus copy in the index folder (flashrag-dev 0.1.2 loads it)"}
    )
    faiss_type: str = field(default="Flat", metadata={"help": "faiss factory string: Flat, HNSW32, IVF1024,Flat, ..."})
    pooling_method: str = field(default="mean", metadata={"help": "mean, cls or pooler"})
    max_length: int = field(default=256, metadata={"help": "passage tokens"})
    batch_size: int = field(default=128, metadata={"help": "encoder batch size"})
    use_fp16: bool = field(default=False, metadata={"help": "fp16 encoder (GPU)"})
    instruction: str | None = field(default=None, metadata={"help": "passage prefix (default: by model family)"})
    sentence_transformer: bool = field(default=False, metadata={"help": "load the encoder with sentence-transformers"})
    embedding_path: str = field(default="", metadata={"help": "reuse these embeddings instead of encoding"})
    faiss_gpu: bool = field(default=False, metadata={"help": "build the faiss index on the GPUs"})
    device: str = field(default="auto", metadata={"help": "encoder device: auto, cpu, cuda"})

    def __post_init__(self) -> None:
        if not self.corpus_path:
            raise ValueError("corpus_path is required: the corpus .jsonl to index")
        if not Path(self.corpus_path).is_file():
            raise ValueError(f"corpus_path {self.corpus_path} does not exist")
        if self.retrieval_method != "bm25" and not (self.model_path or self.embedding_path):
            raise ValueError(f"model_path is required to encode a dense {self.retrieval_method!r} index")
        if self.bm25_backend not in ("bm25s", "pyserini"):
            raise ValueError(f"bm25_backend must be bm25s or pyserini, got {self.bm25_backend!r}")


def build_index(config: IndexBuildConfig) -> Path:
    """Build the index a config describes; returns the index folder (BM25) or file (dense)."""
    if config.retrieval_method == "bm25":
        if config.bm25_backend == "pyserini":
            from r3_env.retrieval.pyserini import build_pyserini_index

            return build_pyserini_index(config.corpus_path, config.save_dir)
        from r3_env.retrieval.bm25 import build_bm25_index

        return build_bm25_index(config.corpus_path, config.save_dir, save_corpus=config.bm25_save_corpus)
    from r3_env.retrieval.dense import build_dense_index

    return build_dense_index(
        config.corpus_path,
        config.save_dir,
        config.retrieval_method,
        config.model_path,
        faiss_type=config.faiss_type,
        pooling_method=config.pooling_method,
        max_length=config.max_length,
        batch_size=config.batch_size,
        use_fp16=config.use_fp16,
        instruction=config.instruction,
        sentence_transformer=config.sentence_transformer,
        embedding_path=config.embedding_path or None,
        faiss_gpu=config.faiss_gpu,
        device=config.device,
    )
