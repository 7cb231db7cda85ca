"""Random access to a FlashRAG corpus by row number, without holding it in memory.

Indexes (faiss, bm25s) return row numbers; the corpus file is the source of truth for ids and
contents. A :class:`DocStore` keeps one int64 byte offset per row (168 MB for 21M passages),
built once by streaming the file and cached next to the index, and reads rows through a
memory map, so a Wikipedia-sized corpus costs disk reads, not RAM.
"""

from __future__ import annotations

import functools
import json
import logging
import mmap
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from r3_env.data import DataFormatError, Passage, parse_passage_row

logger = logging.getLogger(__name__)


def corpus_fingerprint(path: Path) -> dict[str, int | str]:
    """Cheap identity of a corpus file: size and modification time (a rewrite invalidates caches)."""
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def scan_offsets(path: Path) -> np.ndarray:
    """Byte offsets of every non-blank line, plus the file size as the last entry."""
    offsets: list[int] = []
    started = time.perf_counter()
    with open(path, "rb") as handle:
        position = 0
        for line in handle:
            if line.strip():
                offsets.append(position)
            position += len(line)
    offsets.append(position)
    elapsed = time.perf_counter() - started
    logger.info("indexed %d corpus rows of %s in %.1f s", len(offsets) - 1, path, elapsed)
    return np.asarray(offsets, dtype=np.int64)


class DocStore:
    """Rows of a FlashRAG corpus (``.jsonl``, not gzip) by number.

    ``cache_dir``: where to keep the offsets (default: beside the corpus, or not at all when
    that folder is read-only).
    """

    def __init__(
        self, corpus_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None, cached_rows: int = 65_536
    ) -> None:
        self.path = Path(corpus_path)
        if not self.path.is_file():
            raise FileNotFoundError(f"corpus_path {self.path} does not exist; give the corpus .jsonl of the index")
        if self.path.name.endswith(".gz"):
            raise ValueError(f"corpus_path {self.path}: random access needs an uncompressed .jsonl; gunzip it first")
        self.offsets = self._load_offsets(Path(cache_dir) if cache_dir else self.path.parent)
        self._file = open(self.path, "rb")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if self.offsets[-1] else None
        # popular passages come back again and again in RL rollouts: keep the parsed ones
        self.row = functools.lru_cache(maxsize=cached_rows)(self._read_row)

    def _load_offsets(self, cache_dir: Path) -> np.ndarray:
        cache = cache_dir / f"{self.path.name}.offsets.npy"
        meta = cache.with_suffix(".json")
        fingerprint = corpus_fingerprint(self.path)
        if cache.exists() and meta.exists():
            try:
                if json.loads(meta.read_text()) == fingerprint:
                    return np.load(cache)
            except ValueError:
                pass
        offsets = scan_offsets(self.path)
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            np.save(cache, offsets)
            meta.write_text(json.dumps(fingerprint))
        except OSError as error:
            logger.info("not caching corpus offsets in %s (%s)", cache_dir, error)
        return offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _read_row(self, index: int) -> Passage:
        if not 0 <= index < len(self):
            raise IndexError(f"corpus row {index} is out of range (the corpus has {len(self)} rows)")
        start, stop = int(self.offsets[index]), int(self.offsets[index + 1])
        raw = self._map[start:stop]
        try:
            return parse_passage_row(json.loads(raw.decode("utf-8")), self.path, index + 1)
        except ValueError as error:
            if isinstance(error, DataFormatError):
                raise
            raise DataFormatError(self.path, index + 1, None, f"not valid JSON ({error})") from None

    def rows(self, indices: Sequence[int]) -> list[Passage]:
        return [self.row(int(i)) for i in indices]

    def close(self) -> None:
        self.row.cache_clear()
        if self._map is not None:
            self._map.close()
        self._file.close()
