"""BM25 with Pyserini (Lucene), FlashRAG's ``bm25_backend: pyserini``; it needs Java 21 or newer.

Built with Pyserini's own indexer over the corpus in JsonCollection form, storing raw
documents, as FlashRAG does, so an index from ``flashrag.retriever.index_builder --bm25_backend
pyserini`` serves too.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from r3_env.data import Passage
from r3_env.retrieval.base import Hit, Retriever, check_k
from r3_env.retrieval.docstore import DocStore

logger = logging.getLogger(__name__)

MIN_JAVA = 21


def java_major_version() -> int | None:
    """The major version of the ``java`` Pyserini would start (JAVA_HOME first, then PATH)."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        return None
    result = subprocess.run([java, "-version"], capture_output=True, text=True)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', result.stderr + result.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


def require_pyserini() -> None:
    """Raise a clear error unless Pyserini and Java 21+ are available."""
    try:
        import pyserini  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "bm25_backend pyserini needs the pyserini package (pip install pyserini==1.6.0) and "
            f"Java {MIN_JAVA}+; or use bm25_backend: bm25s"
        ) from None
    major = java_major_version()
    if major is None or major < MIN_JAVA:
        found = f"Java {major}" if major else "no Java"
        raise RuntimeError(
            f"bm25_backend pyserini needs Java {MIN_JAVA} or newer, found {found}: install a JDK "
            f"{MIN_JAVA}+ and set JAVA_HOME to it, or use bm25_backend: bm25s"
        )


def build_pyserini_index(corpus_path: str | Path, save_dir: str | Path, threads: int = 2) -> Path:
    require_pyserini()
    folder = Path(save_dir) / "bm25"
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as staging:
        os.symlink(Path(corpus_path).resolve(), Path(staging) / "corpus.jsonl")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pyserini.index.lucene",
                "--collection",
                "JsonCollection",
                "--input",
                staging,
                "--index",
                str(folder),
                "--generator",
                "DefaultLuceneDocumentGenerator",
                "--threads",
                str(threads),
                "--storeRaw",
            ],
            check=True,
        )
    return folder


class PyseriniRetriever(Retriever):
    """Lucene BM25 search; documents come from the index's stored raw JSON or from the corpus."""

    def __init__(self, index_path: str | Path, corpus_path: str | Path | None = None) -> None:
        require_pyserini()
        from pyserini.search.lucene import LuceneSearcher

        self.searcher = LuceneSearcher(str(index_path))
        self.docs = DocStore(corpus_path) if corpus_path else None
        self._row_of_id: dict[str, int] | None = None

    def _passage(self, docid: str) -> Passage:
        import json

        raw = self.searcher.doc(docid).raw()
        if raw:
            return Passage(docid, json.loads(raw)["contents"])
        if self.docs is None:
            raise RuntimeError("the Lucene index stores no raw documents: set corpus_path")
        if self._row_of_id is None:
            self._row_of_id = {self.docs.row(i).id: i for i in range(len(self.docs))}
        return self.docs.row(self._row_of_id[docid])

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_k(k)
        results = self.searcher.batch_search(list(queries), [str(i) for i in range(len(queries))], k=k, threads=2)
        return [
            [Hit(self._passage(hit.docid), float(hit.score)) for hit in results[str(i)]] for i in range(len(queries))
        ]
