"""FlashRAG dataset and corpus files: typed records, streaming readers, validated, append-only writers.

Dataset rows: ``{"id", "question", "golden_answers": [...], "metadata": {...}}``.
Corpus rows: ``{"id", "contents": "title\\ntext"}`` (``{"id", "title", "text"}`` is accepted too).
Files may be gzip-compressed (``.gz``). Readers stream line by line, so a 21M-passage corpus is
never held in memory; every validation error names the file, the line and the field.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


class DataFormatError(ValueError):
    """A row of a FlashRAG file is malformed. The message names file, line, field and the fix."""

    def __init__(self, path: PathLike, line: int, field: str | None, message: str) -> None:
        self.path, self.line, self.field = str(path), line, field
        where = f"{path}:{line}"
        super().__init__(f"{where}: field '{field}': {message}" if field else f"{where}: {message}")


@dataclass(frozen=True)
class Passage:
    """A corpus passage. ``contents`` is FlashRAG's ``title\\ntext``."""

    id: str
    contents: str

    @classmethod
    def from_title_text(cls, id: str, title: str, text: str) -> Passage:
        return cls(id=str(id), contents=f"{title}\n{text}")

    @property
    def title(self) -> str:
        # Wikipedia-2018 corpora quote their titles ('"Aaron"\n...'); titles may also end in a quote.
        title = self.contents.split("\n", 1)[0].strip()
        return title[1:-1] if len(title) >= 2 and title[0] == title[-1] == '"' else title

    @property
    def text(self) -> str:
        parts = self.contents.split("\n", 1)
        return parts[1].strip() if len(parts) == 2 else ""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "contents": self.contents}


@dataclass(frozen=True)
class QAItem:
    """A dataset question. ``extra`` keeps any other top-level keys so a rewrite loses nothing."""

    id: str
    question: str
    golden_answers: list[str]
    metadata: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        row = {
            "id": self.id,
            "question": self.question,
            "golden_answers": list(self.golden_answers),
            "metadata": self.metadata,
        }
        row.update(self.extra)
        return row


@dataclass(frozen=True)
class Label:
    """What a rollout's label tells the environment: the golden answers, and optionally the question and gold ids."""

    golden_answers: list[str]
    question: str | None = None
    gold_ids: list[str] = field(default_factory=list)
    start_documents: list[Passage] = field(default_factory=list)  # documents the episode starts from (R2AG rounds)
    problem: str | None = None  # why part of the label could not be read (the episode gets a neutral reward)


def _strings(values: Any) -> list[str]:
    if isinstance(values, (str, int, float)) and not isinstance(values, bool):
        values = [values]
    if not isinstance(values, list):
        return []
    return [str(v) for v in values if isinstance(v, (str, int, float)) and not isinstance(v, bool) and str(v).strip()]


def read_label(label: Any) -> Label:
    """A label as OpenRLHF passes it (``--data.label_key``): a JSON object, a list of answers, or one answer.

    Objects may name ``golden_answers`` (or ``answers``), ``question``, the gold passages as
    ``gold_ids`` or FlashRAG-style ``supporting_passage_ids``, and ``start_documents``, the
    documents an episode starts from (``[{"id", "contents"}, ...]``), at the top (as when the label
    is a row's ``metadata``) or under ``metadata``. A label naming no usable answer (None, "null",
    an empty list) gives empty ``golden_answers``, and unreadable ``start_documents`` set
    ``problem``; callers report both.
    """
    if isinstance(label, str):
        try:
            label = json.loads(label)
        except ValueError:
            return Label([label] if label.strip() else [])
    if not isinstance(label, dict):
        return Label(_strings(label))
    question = label.get("question") if isinstance(label.get("question"), str) else None
    metadata = label.get("metadata") if isinstance(label.get("metadata"), dict) else {}
    gold = label.get("gold_ids", label.get("supporting_passage_ids", metadata.get("supporting_passage_ids")))
    answers = _strings(label.get("golden_answers", label.get("answers")))
    start = label.get("start_documents", metadata.get("start_documents")) or []
    if not isinstance(start, list) or not all(
        isinstance(d, dict) and isinstance(d.get("id"), (str, int)) and isinstance(d.get("contents"), str)
        for d in start
    ):
        problem = f"its start_documents are not a list of {{'id', 'contents'}} documents ({start!r:.120})"
        return Label(answers, question, _strings(gold), problem=problem)
    passages = [Passage(str(d["id"]), d["contents"]) for d in start]
    return Label(answers, question, _strings(gold), passages)


def open_text(path: PathLike, mode: str = "r", gz: bool | None = None) -> TextIO:
    """Open a text file, gzip-compressed when ``gz`` (by default: when the name ends in .gz)."""
    if gz if gz is not None else str(path).endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, mode.replace("t", "") + "b"), encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def _open_binary(path: PathLike):
    return gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")


def iter_jsonl(path: PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for each non-blank line of a JSON-lines file."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such file")
    with _open_binary(path) as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataFormatError(
                    path,
                    number,
                    None,
                    f"not UTF-8 text ({error.reason} at byte {error.start}); re-encode the file as UTF-8",
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataFormatError(
                    path,
                    number,
                    None,
                    f"not valid JSON ({error.msg} at column {error.colno}); each line must be one JSON object",
                ) from None
            if not isinstance(row, dict):
                raise DataFormatError(path, number, None, f"expected a JSON object, got {type(row).__name__}")
            yield number, row


def _require_id(path: PathLike, number: int, row: dict[str, Any]) -> str:
    if "id" not in row:
        raise DataFormatError(path, number, "id", "missing; every row needs a unique string id")
    value = row["id"]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataFormatError(path, number, "id", f"must be a string, got {type(value).__name__}")
    value = str(value)
    if not value.strip():
        raise DataFormatError(path, number, "id", "is empty; every row needs a unique string id")
    return value


def parse_qa_row(row: dict[str, Any], path: PathLike = "<row>", number: int = 0) -> QAItem:
    """Validate one dataset row (see the module docstring) and return it typed."""
    item_id = _require_id(path, number, row)
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DataFormatError(path, number, "question", "missing or empty; give the question text as a string")
    answers = row.get("golden_answers")
    if isinstance(answers, str):
        raise DataFormatError(
            path,
            number,
            "golden_answers",
            f"must be a list of strings, got the string {answers[:40]!r}; wrap it in a list",
        )
    if not isinstance(answers, list) or not answers:
        raise DataFormatError(
            path, number, "golden_answers", "missing or empty; give a non-empty list of acceptable answers"
        )
    bad = [a for a in answers if not isinstance(a, (str, int, float)) or isinstance(a, bool)]
    if bad:
        raise DataFormatError(path, number, "golden_answers", f"must hold strings, found {bad[0]!r}")
    metadata = row.get("metadata", {})
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise DataFormatError(path, number, "metadata", f"must be an object, got {type(metadata).__name__}")
    extra = {k: v for k, v in row.items() if k not in ("id", "question", "golden_answers", "metadata")}
    return QAItem(item_id, question, [str(a) for a in answers], metadata, extra)


def parse_passage_row(row: dict[str, Any], path: PathLike = "<row>", number: int = 0) -> Passage:
    """Validate one corpus row and return it typed."""
    passage_id = _require_id(path, number, row)
    contents = row.get("contents")
    if contents is None and isinstance(row.get("text"), str):
        title = row.get("title", "")
        if not isinstance(title, str):
            raise DataFormatError(path, number, "title", f"must be a string, got {type(title).__name__}")
        return Passage.from_title_text(passage_id, title, row["text"])
    if not isinstance(contents, str):
        raise DataFormatError(
            path,
            number,
            "contents",
            "missing or not a string; give 'contents' as \"title\\ntext\" (or 'title' and 'text')",
        )
    return Passage(passage_id, contents)


def iter_dataset(path: PathLike) -> Iterator[QAItem]:
    """Stream a FlashRAG dataset file, validating each row."""
    for number, row in iter_jsonl(path):
        yield parse_qa_row(row, path, number)


def read_dataset(path: PathLike, unique_ids: bool = True) -> list[QAItem]:
    """Load a whole dataset file; duplicate ids are an error unless ``unique_ids=False``."""
    items: list[QAItem] = []
    seen: dict[str, int] = {}
    for number, row in iter_jsonl(path):
        item = parse_qa_row(row, path, number)
        if unique_ids:
            if item.id in seen:
                raise DataFormatError(path, number, "id", f"duplicate id {item.id!r} (first on line {seen[item.id]})")
            seen[item.id] = number
        items.append(item)
    return items


def iter_corpus(path: PathLike) -> Iterator[Passage]:
    """Stream a FlashRAG corpus file, validating each row."""
    for number, row in iter_jsonl(path):
        yield parse_passage_row(row, path, number)


def load_passages(path: PathLike, ids: Iterable[str]) -> dict[str, Passage]:
    """The passages with the given ids, read by streaming the corpus once."""
    wanted = set(ids)
    found: dict[str, Passage] = {}
    for passage in iter_corpus(path):
        if passage.id in wanted:
            found[passage.id] = passage
            if len(found) == len(wanted):
                break
    return found


def _repair_partial_tail(path: Path) -> None:
    """Drop an unterminated last line (a write cut short by a kill) so appends stay valid JSONL."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return
        size = handle.seek(0, os.SEEK_END)
        block = min(size, 1 << 20)
        while True:
            handle.seek(size - block)
            chunk = handle.read(block)
            cut = chunk.rfind(b"\n")
            if cut >= 0 or block == size:
                break
            block = min(size, block * 2)
        keep = size - block + cut + 1 if cut >= 0 else 0
        tail = chunk[cut + 1 :] if cut >= 0 else chunk
        try:
            json.loads(tail)
            handle.seek(0, os.SEEK_END)
            handle.write(b"\n")  # a complete row that only lacked its newline
            return
        except ValueError:
            pass
        logger.warning("%s: dropping an incomplete last line (%d bytes) left by an interrupted write", path, len(tail))
        handle.truncate(keep)


class JsonlWriter:
    """Append-only JSON-lines writer: rows already in the file are never rewritten.

    Opening repairs an incomplete last line left by a killed run, so ``resume`` logic can read
    :func:`existing_ids` and append only what is missing. Each row is flushed as it is written.
    """

    def __init__(self, path: PathLike) -> None:
        self.path = Path(path)
        if self.path.name.endswith(".gz"):
            raise ValueError(
                f"{path}: append-only outputs cannot be gzip files (a killed run leaves a gzip stream "
                "that cannot be resumed); write plain .jsonl and compress when the run is complete"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _repair_partial_tail(self.path)
        self._handle = open_text(self.path, "a")
        self.written = 0

    def write(self, row: dict[str, Any]) -> None:
        self._handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._handle.flush()
        self.written += 1

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def existing_ids(path: PathLike, key: str = "id") -> set[str]:
    """Ids of the rows already in an append-only output (empty if it does not exist).

    A row counts when its line parses as JSON, the same rule :class:`JsonlWriter` applies when it
    repairs the last line, so a resumed run neither repeats nor skips a row.
    """
    path = Path(path)
    if not path.exists():
        return set()
    ids: set[str] = set()
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                row = json.loads(raw)
            except ValueError:
                if raw.endswith(b"\n"):
                    logger.warning("%s:%d: skipping a line that is not valid JSON", path, number)
                continue
            if isinstance(row, dict) and key in row:
                ids.add(str(row[key]))
    return ids


def write_jsonl(
    path: PathLike, rows: Iterable[dict[str, Any]], total: int | None = None, desc: str | None = None
) -> int:
    """Write a whole file atomically (temp file, then rename); returns the row count.

    With ``desc``, logs the rate when done and, for 10,000 rows or more, shows a progress bar.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    started = time.perf_counter()
    try:
        count = _write_rows(tmp, path, rows, total, desc)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    if desc is not None:
        elapsed = time.perf_counter() - started
        logger.info("wrote %s: %d %s in %.1f s (%.0f/s)", path, count, desc, elapsed, count / max(elapsed, 1e-9))
    return count


def _write_rows(tmp: Path, path: Path, rows: Iterable[dict[str, Any]], total: int | None, desc: str | None) -> int:
    count = 0
    with (
        open_text(tmp, "w", gz=path.name.endswith(".gz")) as handle,
        tqdm(
            total=total, desc=desc, unit=" rows", mininterval=1.0, disable=desc is None or (total or 0) < 10_000
        ) as bar,
    ):
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
            bar.update()
    return count


def write_dataset(path: PathLike, items: Iterable[QAItem]) -> int:
    return write_jsonl(path, (item.to_json() for item in items))


def write_corpus(path: PathLike, passages: Iterable[Passage]) -> int:
    return write_jsonl(path, (passage.to_json() for passage in passages))
