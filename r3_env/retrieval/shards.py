"""Sharded dense retrieval: a faiss index split into S files, each held by a Ray actor.

A Flat index over Wikipedia-2018 with E5-base is 4 x 768 x 21M bytes, about 64 GB: more than one
GPU holds, and more than many nodes can spare. ``r3rag index shard`` splits an existing index
into S contiguous row ranges (``{index}.shard{i}of{S}`` plus a manifest ``{index}.shards.json``);
serving the manifest as ``index_path`` puts each shard in its own Ray actor (CPU or one GPU
each, on whichever nodes have room). A query batch is encoded once, fans out to every shard,
and the shards' top-k lists merge into exactly the unsharded top-k: a Flat shard scans its
rows exhaustively, and an IVF shard keeps the unsharded index's trained quantizer, so it probes
the same clusters and scores the same codes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

MANIFEST_SUFFIX = ".shards.json"
NAMESPACE = "r3rag"


def is_manifest(path: str | os.PathLike) -> bool:
    return str(path).endswith(MANIFEST_SUFFIX)


def manifest_path(index_path: str | os.PathLike) -> Path:
    return Path(str(index_path) + MANIFEST_SUFFIX)


def shard_index(index_path: str | os.PathLike, shards: int) -> Path:
    """Split the faiss index at ``index_path`` into ``shards`` files; returns the manifest.

    Flat indexes are copied row range by row range from a memory map, so splitting needs only
    one shard's memory. IVF indexes keep their trained quantizer and codes (each shard holds
    the entries whose row falls in its range, under their global row ids). Other index types
    (HNSW graphs) cannot be split and are refused.
    """
    import faiss

    source = Path(index_path)
    if not source.is_file():
        raise FileNotFoundError(f"index_path {source} does not exist; build it with `r3rag index build` first")
    if shards < 2:
        raise ValueError(f"shards must be at least 2, got {shards}")
    index = faiss.read_index(str(source), faiss.IO_FLAG_MMAP)
    if shards > index.ntotal:
        raise ValueError(f"shards={shards} exceeds the index's {index.ntotal} vectors")
    bounds = np.linspace(0, index.ntotal, shards + 1).astype(np.int64)
    if isinstance(index, faiss.IndexFlat):
        write_shard, global_ids = _flat_shard(index), False
    elif isinstance(index, faiss.IndexIVF):
        write_shard, global_ids = _ivf_shard(index), True
    else:
        raise ValueError(
            f"{source} is a {type(index).__name__}, which cannot be split row by row; shard Flat or IVF "
            "indexes, or rebuild with `r3rag index build --faiss_type Flat` (or IVF...) first"
        )
    entries, started = [], time.perf_counter()
    for number, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        path = source.with_name(f"{source.name}.shard{number}of{shards}")
        shard = write_shard(int(start), int(stop))
        faiss.write_index(shard, str(path))
        entries.append({"path": path.name, "offset": 0 if global_ids else int(start), "rows": [int(start), int(stop)]})
        elapsed = time.perf_counter() - started
        logger.info("wrote shard %d/%d: rows %d-%d (%.1f s)", number + 1, shards, start, stop, elapsed)
    manifest = {
        "source": source.name,
        "dim": int(index.d),
        "count": int(index.ntotal),
        "metric": "inner_product" if index.metric_type == faiss.METRIC_INNER_PRODUCT else "l2",
        "shards": entries,
    }
    path = manifest_path(source)
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    meta = source.with_name(source.name + ".json")  # what the index was built from, checked when served
    if meta.is_file():
        path.with_name(path.name + ".json").write_text(meta.read_text())
    return path


def _flat_shard(index):
    import faiss

    def write(start: int, stop: int):
        shard = faiss.IndexFlat(index.d, index.metric_type)
        for begin in range(start, stop, 100_000):
            shard.add(index.reconstruct_n(begin, min(stop, begin + 100_000) - begin))
        return shard

    return write


def _ivf_shard(index):
    import faiss

    # A trained copy without entries: clone the index with its (memory-mapped) lists swapped out.
    lists, count, placeholder = index.invlists, index.ntotal, faiss.ArrayInvertedLists(index.nlist, index.code_size)
    index.own_invlists = False
    index.replace_invlists(placeholder, False)
    index.ntotal = 0
    empty = faiss.clone_index(index)
    index.replace_invlists(lists, True)
    index.ntotal = count

    def write(start: int, stop: int):
        shard = faiss.clone_index(empty)
        index.copy_subset_to(shard, 0, start, stop)  # 0: the entries whose id is in [start, stop)
        return shard

    return write


def read_manifest(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"index_path {path} does not exist; write it with `r3rag index shard`")
    manifest = json.loads(path.read_text())
    for entry in manifest.get("shards", []):
        shard = path.parent / entry["path"]
        if not shard.is_file():
            raise FileNotFoundError(f"{path} lists the shard {shard}, which is missing; run `r3rag index shard` again")
    return manifest


def _actor_exists(name: str) -> bool:
    import ray

    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    return True


class IndexShard:
    """One shard of a sharded index, loaded in a Ray actor; answers searches with global row ids."""

    def __init__(self, path: str, offset: int, nprobe: int, gpu: bool) -> None:
        import faiss

        self.index = faiss.read_index(path)
        self.offset = offset
        if hasattr(self.index, "nprobe"):
            self.index.nprobe = nprobe
        if gpu:
            self.index = faiss.index_cpu_to_all_gpus(self.index)

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores, rows = self.index.search(vectors, min(k, self.index.ntotal))
        return scores, np.where(rows >= 0, rows + self.offset, -1)


def merge_topk(
    parts: list[tuple[np.ndarray, np.ndarray]], k: int, higher_is_better: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The best ``k`` (score, row) pairs per query over every shard's answer, ties broken by row id."""
    scores = np.concatenate([part[0] for part in parts], axis=1)
    rows = np.concatenate([part[1] for part in parts], axis=1)
    key = np.where(rows < 0, np.inf, -scores if higher_is_better else scores)
    order = np.lexsort((rows, key), axis=1)[:, :k]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(rows, order, axis=1)


class ShardedIndex:
    """The faiss ``search``/``ntotal``/``d`` surface over the Ray actors that hold a manifest's shards.

    The actors are named after the manifest and its search settings, so every process that opens
    the same manifest (the Serve replicas of one deployment) shares one set. The process that
    created them owns them: they live as long as it does, and :meth:`close` removes them.
    """

    def __init__(self, manifest: str | os.PathLike, nprobe: int, gpu: bool = False, num_cpus: float = 1) -> None:
        import ray

        path = Path(manifest).resolve()
        spec = read_manifest(path)
        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS") or None, namespace=NAMESPACE, log_to_driver=False)
        tag = hashlib.sha1(f"{path}|{path.stat().st_mtime_ns}|{nprobe}|{gpu}".encode()).hexdigest()[:12]
        actor = ray.remote(IndexShard)
        self.d, self.ntotal = int(spec["dim"]), int(spec["count"])
        self.higher_is_better = spec.get("metric", "inner_product") == "inner_product"
        self.actors: list = []
        self.owned: list[tuple[str, object]] = []  # (name, handle) of the actors this process created
        for number, entry in enumerate(spec["shards"]):
            name = f"shard-{tag}-{number}"
            try:
                handle = ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                handle = actor.options(
                    name=name, namespace=NAMESPACE, get_if_exists=True, num_cpus=num_cpus, num_gpus=1 if gpu else 0
                ).remote(str(path.parent / entry["path"]), int(entry["offset"]), nprobe, gpu)
                self.owned.append((name, handle))
            self.actors.append(handle)
        ray.get([handle.__ray_ready__.remote() for handle in self.actors])  # a bad shard file fails here
        logger.info("%d index shards ready (%d vectors of dim %d)", len(self.actors), self.ntotal, self.d)

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        import ray

        shared = ray.put(np.ascontiguousarray(vectors, dtype=np.float32))
        parts = ray.get([shard.search.remote(shared, k) for shard in self.actors])
        return merge_topk(parts, k, self.higher_is_better)

    def close(self, timeout_s: float = 30.0) -> None:
        """Kill the shard actors this process created and wait until Ray has released their names.

        ``ray.kill`` only asks for the kill; until the actor is gone its name still resolves, so a
        manifest reopened right after would attach to a dying actor instead of starting a new one.
        """
        import ray

        names = [name for name, _ in self.owned]
        for _, handle in self.owned:
            ray.kill(handle)
        self.owned = []
        deadline = time.monotonic() + timeout_s
        while names := [name for name in names if _actor_exists(name)]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Ray still lists the killed index shards {names} after {timeout_s:.0f} s")
            time.sleep(0.05)
