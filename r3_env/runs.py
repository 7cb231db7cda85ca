"""What every run over FlashRAG datasets shares: named questions, a settings manifest, a retrieval source.

Cold-start synthesis and evaluation both write append-only folders that a rerun resumes. Their
rows are keyed ``DATASET/QUESTION_ID`` (a dataset is named by its folder, FlashRAG's layout
``DATASET/split.jsonl``), and the settings a folder was made with are recorded beside the rows so
a resumed run cannot mix in rows made with other ones.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from r3_env.config import configs_from_values, load_yaml
from r3_env.data import QAItem, existing_ids, read_dataset

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetrievalSource:
    """Where documents come from: the retrieval service, or a retriever loaded in this process."""

    url: str = field(default="", metadata={"help": "retrieval service URL (r3rag retriever serve)"})
    config: str = field(default="", metadata={"help": "or: a retriever YAML (as for r3rag retriever serve --config)"})
    timeout_s: float = field(default=60.0, metadata={"help": "per request"})
    retries: int = field(default=3, metadata={"help": "per request"})

    def __post_init__(self) -> None:
        if self.url and self.config:
            raise ValueError("give exactly one of retrieval.url (a running service) or retrieval.config (a YAML file)")

    @property
    def given(self) -> bool:
        return bool(self.url or self.config)

    def open(self) -> Any:
        """The async retriever: the service's client, or the YAML's retriever in a worker thread."""
        from r3_env.retrieval import open_async_retriever

        if not self.given:
            raise ValueError("give exactly one of retrieval.url (a running service) or retrieval.config (a YAML file)")
        if self.url:
            return open_async_retriever(self.url, timeout=self.timeout_s, retries=self.retries)
        return open_async_retriever(config=retriever_config(self.config))


@dataclass(frozen=True)
class JudgeClientConfig:
    """The correctness judge, for answers that do not match a golden answer as strings."""

    url: str = field(default="", metadata={"help": "reward server URL (r3rag reward serve); empty: match only"})
    timeout_s: float = field(default=300.0, metadata={"help": "per request"})
    retries: int = field(default=3, metadata={"help": "per request"})


def retriever_config(path: str) -> Any:
    """The retriever of a YAML file written for ``r3rag retriever serve --config`` (its service keys are ignored)."""
    from r3_env.retrieval.cli import SERVE_SECTIONS
    from r3_env.retrieval.config import FLASHRAG_IGNORED_KEYS

    values = {key: value for key, value in load_yaml(path).items() if key not in FLASHRAG_IGNORED_KEYS}
    return configs_from_values(values, SERVE_SECTIONS, where=path)[0]


@dataclass(frozen=True)
class Question:
    dataset: str
    item: QAItem

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.item.id}"


def dataset_paths(data: str) -> list[Path]:
    """The files of a comma-separated ``data`` value."""
    return [Path(part.strip()) for part in data.split(",") if part.strip()]


def dataset_names(paths: list[Path]) -> list[str]:
    """Each file's dataset name: its folder (FlashRAG layout: DATASET/split.jsonl), else its file name."""
    names = [path.parent.name or path.stem for path in paths]
    if len(set(names)) < len(names):
        names = [path.stem if names.count(name) > 1 else name for path, name in zip(paths, names, strict=True)]
    if len(set(names)) < len(names):
        raise ValueError(
            f"data: {', '.join(map(str, paths))} do not have distinct names (their folder, else their file name); "
            "give each dataset its own folder (FlashRAG layout: DATASET/split.jsonl) and list each once"
        )
    return names


def load_questions(paths: list[Path], max_questions: int = 0) -> list[Question]:
    """The questions of every dataset file (the first ``max_questions`` of each when set), named by dataset."""
    questions = []
    for path, name in zip(paths, dataset_names(paths), strict=True):
        items = read_dataset(path)
        if max_questions:
            items = items[:max_questions]
        questions += [Question(name, item) for item in items]
        logger.info("%s: %d questions from %s", name, len(items), path)
    return questions


def _dotted(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _added_env_defaults(now: dict[str, Any]) -> dict[str, Any]:
    """The episode rules' defaults among ``now``'s dotted keys: a manifest written before a rule existed
    (``env.question_docs``, ...) ran under its default."""
    from r3_env.env import env_defaults

    return {f"env.{key}": value for key, value in env_defaults().items() if f"env.{key}" in now}


def check_manifest(manifest: Path, rows: Path, settings: dict[str, Any]) -> None:
    """Record the settings in ``manifest``, or refuse to add to ``rows`` made with other ones."""
    if manifest.exists() and existing_ids(rows):
        now = _dotted(settings)
        before = _added_env_defaults(now) | _dotted(json.loads(manifest.read_text()))
        if before != now:
            keys = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
            changed = [f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in keys]
            raise ValueError(
                f"{rows.parent} holds rows made with other settings ({'; '.join(changed)}); "
                f"choose another --out, or rerun with the settings recorded in {manifest}"
            )
        return
    manifest.parent.mkdir(parents=True, exist_ok=True)  # no row yet: (re)record the settings
    manifest.write_text(json.dumps(settings, indent=2) + "\n")


Job = TypeVar("Job")
Result = TypeVar("Result")


class Counts(Protocol):
    """What :func:`run_jobs` keeps up to date (the caller's run stats)."""

    done: int
    failed: int
    last_error: str


@dataclass
class JobCounts:
    """Plain :class:`Counts` for callers with no run stats of their own."""

    done: int = 0
    failed: int = 0
    last_error: str = ""


async def run_jobs(
    jobs: Sequence[Job],
    work: Callable[[Job], Awaitable[Result]],
    finish: Callable[[Job, Result], None],
    failures: tuple[type[BaseException], ...],
    counts: Counts,
    concurrency: int,
    abort_after: int,
    name: Callable[[Job], str],
    progress: Any,
) -> bool:
    """Run ``work`` over ``jobs``, ``concurrency`` at a time; ``finish`` each result as it comes (write it).

    A job whose work raises one of ``failures`` is counted and skipped (not finished, so a rerun
    retries it); ``abort_after`` of them in a row stop the run early. Returns whether it stopped
    early. Anything else (a bug, an interrupt) cancels the other workers and is raised.
    """
    queue, consecutive, abort = deque(jobs), 0, asyncio.Event()

    async def worker() -> None:
        nonlocal consecutive
        while queue and not abort.is_set():
            job = queue.popleft()
            try:
                result = await work(job)
            except failures as error:
                counts.failed += 1
                consecutive += 1
                counts.last_error = str(error)
                logger.warning("%s failed: %s", name(job), error)
                if consecutive >= abort_after and queue:
                    abort.set()
                progress.update()
                continue
            consecutive = 0
            finish(job, result)
            counts.done += 1
            progress.update()

    workers = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(jobs)) or 1)]
    try:
        await asyncio.gather(*workers)
    except BaseException:  # stop the other workers before the caller closes its files
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        raise
    finally:
        progress.close()
    return abort.is_set()
