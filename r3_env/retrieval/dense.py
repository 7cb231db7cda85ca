"""Dense retrieval with faiss: building indexes (resumable encoding) and searching them.

On disk, FlashRAG's layout: ``{save_dir}/{method}_{faiss_type}.index`` (inner product over
L2-normalised embeddings) and ``{save_dir}/emb_{method}.memmap`` (float32, one row per corpus
row, no header). r3rag adds two small JSON files beside them: ``emb_{method}.progress.json``
(how many rows are encoded, with what model and settings: a killed encode resumes there) and
``{index}.json`` (what the index was built from, checked when it is served). An index built by
FlashRAG, without them, loads too.

Memory: a Flat index holds 4 x dim x N bytes (E5-base over 21M Wikipedia passages: 64 GB);
``IVF{n},PQ{m}`` compresses it to about m x N bytes at some loss of recall.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from r3_env.retrieval.base import Hit, Retriever, check_k
from r3_env.retrieval.bm25 import IndexFormatError
from r3_env.retrieval.config import RetrieverConfig, instruction_prefix
from r3_env.retrieval.docstore import DocStore, corpus_fingerprint
from r3_env.retrieval.encoder import Encoder
from r3_env.retrieval.shards import ShardedIndex, is_manifest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EncodingSpec:
    """Everything that determines the embeddings; a resumed encode must match it exactly."""

    retrieval_method: str
    model_path: str
    pooling_method: str
    max_length: int
    instruction: str
    sentence_transformer: bool
    corpus: dict


def index_file(save_dir: str | Path, retrieval_method: str, faiss_type: str) -> Path:
    return Path(save_dir) / f"{retrieval_method}_{faiss_type}.index"


def embedding_file(save_dir: str | Path, retrieval_method: str) -> Path:
    return Path(save_dir) / f"emb_{retrieval_method}.memmap"


def finished_embeddings(save_dir: str | Path, retrieval_method: str, spec: EncodingSpec, rows: int) -> np.memmap | None:
    """The saved embeddings of a completed encode with exactly this spec, or None."""
    path = embedding_file(save_dir, retrieval_method)
    progress_path = path.with_suffix(".progress.json")
    if not (path.exists() and progress_path.exists()):
        return None
    recorded = json.loads(progress_path.read_text())
    if recorded.get("spec") != asdict(spec) or recorded.get("rows_done") != rows:
        return None
    return np.memmap(path, dtype=np.float32, mode="r", shape=(rows, int(recorded["dim"])))


def encode_corpus(
    corpus_path: str | Path,
    save_dir: str | Path,
    retrieval_method: str,
    encoder: Encoder,
    spec: EncodingSpec,
    batch_size: int,
    chunk: int = 4096,
) -> np.memmap:
    """Embed every corpus row into ``emb_{method}.memmap``, resuming a previous partial run.

    Progress is recorded after each chunk of rows, so a kill loses at most one chunk.
    """
    docs = DocStore(corpus_path, cache_dir=save_dir)
    rows = len(docs)
    path = embedding_file(save_dir, retrieval_method)
    progress_path = path.with_suffix(".progress.json")
    done = 0
    if path.exists() and progress_path.exists():
        recorded = json.loads(progress_path.read_text())
        if recorded.get("spec") == asdict(spec) and recorded.get("dim") == encoder.dim:
            done = int(recorded["rows_done"])
            logger.info("resuming the encode of %s at row %d of %d", corpus_path, done, rows)
        else:
            logger.warning("%s was encoded with other settings; encoding again from the start", path)
    mode = "r+" if done else "w+"
    embeddings = np.memmap(path, dtype=np.float32, mode=mode, shape=(rows, encoder.dim))
    started, first = time.perf_counter(), done
    while done < rows:
        stop = min(rows, done + chunk)
        texts = [spec.instruction + p.contents for p in docs.rows(range(done, stop))]
        embeddings[done:stop] = encoder.encode(texts, batch_size=batch_size)
        embeddings.flush()
        done = stop
        progress_path.write_text(json.dumps({"rows_done": done, "dim": encoder.dim, "spec": asdict(spec)}))
        rate = (done - first) / max(time.perf_counter() - started, 1e-9)
        logger.info("encoded %d/%d passages (%.0f docs/s, %.0f s left)", done, rows, rate, (rows - done) / rate)
    docs.close()
    return embeddings


def build_faiss_index(embeddings: np.ndarray, faiss_type: str, use_gpu: bool = False, train_sample: int = 262_144):
    """An inner-product faiss index of the given factory type (Flat, HNSW32, IVF4096,Flat, IVF4096,PQ64 ...)."""
    import faiss

    dim = embeddings.shape[1]
    try:
        index = faiss.index_factory(dim, faiss_type, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as error:
        raise ValueError(
            f"faiss_type {faiss_type!r} is not a faiss index factory string ({error}); "
            "try Flat, HNSW32, IVF1024,Flat or IVF1024,PQ64"
        ) from None
    if use_gpu:
        index = faiss.index_cpu_to_all_gpus(index)
    if not index.is_trained:
        rng = np.random.default_rng(0)
        sample = (
            embeddings
            if len(embeddings) <= train_sample
            else embeddings[np.sort(rng.choice(len(embeddings), train_sample, replace=False))]
        )
        logger.info("training the %s index on %d vectors", faiss_type, len(sample))
        index.train(np.ascontiguousarray(sample))
    for start in range(0, len(embeddings), 100_000):
        index.add(np.ascontiguousarray(embeddings[start : start + 100_000]))
    return faiss.index_gpu_to_cpu(index) if use_gpu else index


def build_dense_index(
    corpus_path: str | Path,
    save_dir: str | Path,
    retrieval_method: str,
    model_path: str,
    faiss_type: str = "Flat",
    pooling_method: str = "mean",
    max_length: int = 256,
    batch_size: int = 128,
    use_fp16: bool = False,
    instruction: str | None = None,
    sentence_transformer: bool = False,
    embedding_path: str | None = None,
    faiss_gpu: bool = False,
    device: str = "auto",
) -> Path:
    """Encode (or reuse embeddings) and write the faiss index; returns the index file."""
    import faiss

    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    passage_prefix = instruction_prefix(instruction, retrieval_method, passage=True)
    corpus = Path(corpus_path)
    spec = EncodingSpec(
        retrieval_method,
        model_path,
        pooling_method,
        max_length,
        passage_prefix,
        sentence_transformer,
        corpus_fingerprint(corpus),
    )
    docs = DocStore(corpus, cache_dir=save_dir)
    rows = len(docs)
    docs.close()
    if embedding_path:
        raw = np.memmap(embedding_path, dtype=np.float32, mode="r")
        if raw.size % rows:
            raise ValueError(
                f"embedding_path {embedding_path} holds {raw.size} floats, not a multiple of the "
                f"corpus's {rows} rows: it was not computed for this corpus"
            )
        embeddings = raw.reshape(rows, raw.size // rows)
        logger.info("reusing %d embeddings of dim %d from %s", rows, embeddings.shape[1], embedding_path)
    else:
        embeddings = finished_embeddings(save_dir, retrieval_method, spec, rows)
        if embeddings is not None:
            logger.info("reusing the %d embeddings already computed in %s", rows, save_dir)
        else:
            encoder = Encoder(
                model_path,
                pooling_method,
                max_length,
                use_fp16,
                sentence_transformer,
                device,
                normalize="dpr" not in retrieval_method.lower(),
            )
            embeddings = encode_corpus(corpus, save_dir, retrieval_method, encoder, spec, batch_size)
    started = time.perf_counter()
    index = build_faiss_index(embeddings, faiss_type, use_gpu=faiss_gpu)
    path = index_file(save_dir, retrieval_method, faiss_type)
    faiss.write_index(index, str(path))
    meta = {
        "retrieval_method": retrieval_method,
        "faiss_type": faiss_type,
        "dim": int(embeddings.shape[1]),
        "count": int(index.ntotal),
        "spec": asdict(spec),
    }
    path.with_name(path.name + ".json").write_text(json.dumps(meta, indent=2) + "\n")
    logger.info("wrote %s (%d vectors, %.1f s)", path, index.ntotal, time.perf_counter() - started)
    return path


class DenseRetriever(Retriever):
    """Top-k inner-product search over a faiss index, rows mapped back through the corpus."""

    def __init__(self, config: RetrieverConfig) -> None:
        import faiss

        path = Path(config.index_path)
        if not path.is_file():
            raise FileNotFoundError(
                f"index_path {path} does not exist; build it with `r3rag index build "
                f"--retrieval_method {config.encoder_name} ...`"
            )
        self.config = config
        if is_manifest(path):
            self.index = ShardedIndex(path, config.faiss_nprobe, config.faiss_gpu, config.shard_num_cpus)
        else:
            self.index = faiss.read_index(str(path))
            if hasattr(self.index, "nprobe"):
                self.index.nprobe = config.faiss_nprobe
            if config.faiss_gpu:
                self.index = faiss.index_cpu_to_all_gpus(self.index)
        self.docs = DocStore(config.corpus_path, cache_dir=path.parent)
        if self.index.ntotal != len(self.docs):
            raise IndexFormatError(
                f"the faiss index {path} holds {self.index.ntotal} vectors but {config.corpus_path} "
                f"has {len(self.docs)} rows: give the corpus the index was built from"
            )
        meta_path = path.with_name(path.name + ".json")
        if meta_path.is_file():
            self._check_meta(json.loads(meta_path.read_text()))
        self.encoder = Encoder(
            config.retrieval_model_path,
            config.retrieval_pooling_method,
            config.retrieval_query_max_length,
            config.retrieval_use_fp16,
            config.use_sentence_transformer,
            config.device,
            normalize="dpr" not in config.encoder_name.lower(),
        )
        if self.encoder.dim != self.index.d:
            raise IndexFormatError(
                f"the encoder {config.retrieval_model_path} gives {self.encoder.dim}-d vectors but "
                f"the index {path} holds {self.index.d}-d ones: use the encoder it was built with"
            )
        self.query_prefix = config.query_instruction()

    def _check_meta(self, meta: dict) -> None:
        built = meta.get("spec", {})
        for key, ours in (
            ("model_path", self.config.retrieval_model_path),
            ("pooling_method", self.config.retrieval_pooling_method),
            ("sentence_transformer", self.config.use_sentence_transformer),
        ):
            if key in built and built[key] != ours:
                logger.warning(
                    "the index was built with %s=%r but is served with %r; results will be poor", key, built[key], ours
                )

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_k(k)
        if not queries:
            return []
        vectors = self.encoder.encode([self.query_prefix + q for q in queries], self.config.retrieval_batch_size)
        scores, rows = self.index.search(vectors, min(k, self.index.ntotal))
        return [
            [Hit(self.docs.row(int(i)), float(s)) for i, s in zip(r, sc, strict=True) if i >= 0]
            for r, sc in zip(rows, scores, strict=True)
        ]

    def close(self) -> None:
        self.docs.close()
        if isinstance(self.index, ShardedIndex):
            self.index.close()
