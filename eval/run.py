"""``r3rag eval run``: a method over FlashRAG datasets, one JSON line per question, resumable.

The run folder ``out`` holds

- ``run.json``: what the rows were made with (method, engine, model, retriever, episode rules,
  sampling). A rerun into the same folder with other settings is refused, naming what changed;
- ``predictions.jsonl``, append-only: per question its id (``DATASET/ID``), question, golden
  answers, gold passage ids, every step (analysis, query, documents with ids and titles), the
  final answer and its short form, the number of steps, retrievals and documents read;
- ``runs.jsonl``, append-only: per invocation, a line when it starts (the questions asked per
  dataset, which scoring counts missing rows against) and one when it ends (done, failed, wall
  time, the model's busy time).

A killed run continues where it stopped: questions already in ``predictions.jsonl`` are skipped,
and a question whose engine or retrieval call failed for good is not written, so the next run
retries it. The paper's protocol is the default: greedy, top-5, at most 5 steps.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from eval.engines import ChatEngine, EngineConfig, EngineError, GenerationConfig, make_chat_engine
from eval.methods import Method, MethodContext, TreeSettings, get_method
from r3_env.batching import BatchedSearch
from r3_env.data import JsonlWriter, existing_ids, read_label
from r3_env.env import EnvConfig
from r3_env.protocol import get_format
from r3_env.retrieval.base import Hit
from r3_env.retrieval.client import AsyncRetrievalClient, RetrievalServiceError
from r3_env.runs import (
    Question,
    RetrievalSource,
    check_manifest,
    dataset_paths,
    load_questions,
    retriever_config,
    run_jobs,
)

logger = logging.getLogger(__name__)

FAILURES = (EngineError, RetrievalServiceError)
PREDICTIONS = "predictions.jsonl"
MANIFEST = "run.json"
RUNS_LOG = "runs.jsonl"


R2AG_TREE = TreeSettings.from_recipe()  # the rrt method's defaults


@dataclass(frozen=True)
class EvalRunConfig:
    """What to evaluate, on what, and where the rows go."""

    data: str = field(default="", metadata={"help": "FlashRAG dataset .jsonl files, comma-separated"})
    out: str = field(default="runs/eval/r3", metadata={"help": "run folder (append-only; rerun to resume)"})
    method: str = field(
        default="r3", metadata={"help": "r3, react, direct, naive_rag, rrt, single_shot or flashrag:<pipeline>"}
    )
    name: str = field(default="", metadata={"help": "the run's label in reports (default: the folder's name)"})
    retriever_name: str = field(
        default="", metadata={"help": "the retriever's label in reports (default: from retrieval.config)"}
    )
    step_format: str = field(default="r3", metadata={"help": "step format of the r3 method and the baselines"})
    naive_topk: int = field(
        default=16, metadata={"help": "naive_rag, single_shot: documents retrieved with the question"}
    )
    # the rrt method's defaults: R2AG's recipe (recipes/r2ag.yaml)
    rrt_topk: int = field(default=R2AG_TREE.topk, metadata={"help": "rrt: documents retrieved per query of the tree"})
    rrt_iterations: int = field(default=R2AG_TREE.iterations, metadata={"help": "rrt: tree iterations at most (L_MAX)"})
    rrt_survivors_base: int = field(
        default=R2AG_TREE.survivors_base,
        metadata={"help": "rrt: base queries of a step whose branches go on (Top-Survivor)"},
    )
    rrt_survivors_predicted: int = field(
        default=R2AG_TREE.survivors_predicted,
        metadata={"help": "rrt: predicted queries of a step whose branches go on (Top-Survivor)"},
    )
    rrt_max_base: int = field(default=R2AG_TREE.max_base, metadata={"help": "rrt: base queries a step may write"})
    rrt_max_predicted: int = field(
        default=R2AG_TREE.max_predicted, metadata={"help": "rrt: predicted queries a step may write"}
    )
    reader_format: str = field(
        default="r3", metadata={"help": "rrt: step format the reader answers in from the tree's documents"}
    )
    max_questions: int = field(default=0, metadata={"help": "first N questions of each dataset (0: all)"})
    concurrency: int = field(default=32, metadata={"help": "questions in flight (they share batched generation)"})
    abort_after_failures: int = field(
        default=20, metadata={"help": "stop when this many questions in a row fail for good (engine or retrieval)"}
    )

    def __post_init__(self) -> None:
        if not self.data:
            raise ValueError("data is required: one or more FlashRAG dataset files, comma-separated")
        if get_format(self.step_format).expands_from_context:
            raise ValueError(
                f"step_format {self.step_format!r} steers a retrieval tree one expansion at a time: evaluate it "
                "with --method rrt (its format options are --rrt_max_base / --rrt_max_predicted)"
            )
        if self.naive_topk < 1 or self.concurrency < 1 or self.abort_after_failures < 1:
            raise ValueError("naive_topk, concurrency and abort_after_failures must be at least 1")
        if self.max_questions < 0:
            raise ValueError(f"max_questions must be 0 or more, got {self.max_questions}")
        for name in ("rrt_topk", "rrt_iterations", "rrt_survivors_base", "rrt_max_base"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("rrt_survivors_predicted", "rrt_max_predicted"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more, got {getattr(self, name)}")
        if self.method == "rrt":
            from eval.methods import get_method

            try:  # the reader's format, checked before anything runs
                get_method("rrt", self)
            except ValueError as error:
                raise ValueError(f"reader_format {self.reader_format!r}: {error}") from None


SECTIONS = [
    ("", EvalRunConfig),
    ("env.", EnvConfig),
    ("engine.", EngineConfig),
    ("generation.", GenerationConfig),
    ("retrieval.", RetrievalSource),
]


class EvalAborted(RuntimeError):
    """Too many questions in a row failed; what finished is kept."""


@dataclass
class RunStats:
    todo: int = 0
    done: int = 0
    failed: int = 0
    skipped: int = 0  # already in predictions.jsonl
    wall_s: float = 0.0
    busy_s: float | None = None  # the model generating (None: the engine cannot tell)
    last_error: str = ""

    @property
    def questions_per_s(self) -> float:
        return self.done / self.wall_s if self.wall_s else 0.0

    @property
    def generation_share(self) -> float | None:
        return self.busy_s / self.wall_s if self.busy_s is not None and self.wall_s else None


def retriever_label(
    config: EvalRunConfig, retrieval: RetrievalSource, method: Method, served: dict[str, Any] | None = None
) -> str:
    """The retriever's name in reports: ``retriever_name``, else what the YAML or the service says it is."""
    if not method.retrieves:
        return "none"
    if config.retriever_name:
        return config.retriever_name
    if retrieval.config:
        retriever = retriever_config(retrieval.config)
        return _retriever_name(retriever.retrieval_method, retriever.retrieval_model_path)
    if served and served.get("retrieval_method"):
        return _retriever_name(served["retrieval_method"], served.get("retrieval_model_path") or "")
    return "service"


def _retriever_name(method: str, model_path: str) -> str:
    model = Path(model_path).name if method != "bm25" and model_path else ""
    return f"{method}:{model}" if model else method


def manifest(
    config: EvalRunConfig,
    env: EnvConfig,
    engine: EngineConfig,
    generation: GenerationConfig,
    retrieval: RetrievalSource,
    method: Method,
    served: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``run.json``: everything that changes what a row means, and the labels reports use.

    A service is recorded by what it serves (``served``, its /health), not by its URL: the same
    index behind another port or host makes the same rows, so a resumed run may move.
    """
    settings = method.settings()
    return {
        "name": config.name or Path(config.out).name,
        **settings,
        "retriever": retriever_label(config, retrieval, method, served),
        "retrieval": ({"service": served, "config": retrieval.config} if method.retrieves else None),
        "model": engine.model,
        "engine": engine.kind,
        "chat_template": engine.chat_template if engine.kind != "openai" else "server",
        "step_format": settings.get("step_format") or config.step_format,
        "naive_topk": config.naive_topk if config.method in ("naive_rag", "single_shot") else None,
        "env": asdict(env),
        "generation": asdict(generation),
    }


class NoChatEngine(ChatEngine):
    """The engine of a method that generates nothing (single_shot): asking it is a bug."""

    name = "none"

    def renderer(self, step_format: str, doc_chars: int) -> Any:
        raise RuntimeError("this method generates nothing")

    async def chat(self, messages: Any, max_tokens: int, stop: Any = ()) -> Any:
        raise RuntimeError("this method generates nothing")


async def _no_retriever(query: str, k: int) -> list[Hit]:
    raise RuntimeError("this method retrieves nothing")


def prediction_row(question: Question, method: str, fields: dict[str, Any], time_s: float) -> dict[str, Any]:
    item = question.item
    return {
        "id": question.key,
        "question_id": item.id,
        "dataset": question.dataset,
        "method": method,
        "question": item.question,
        "golden_answers": item.golden_answers,
        "gold_ids": read_label(item.to_json()).gold_ids,
        **fields,
        "time_s": round(time_s, 4),
    }


async def _run(
    method: Method,
    ctx: MethodContext,
    todo: list[Question],
    writer: JsonlWriter,
    stats: RunStats,
    config: EvalRunConfig,
) -> None:
    bar = tqdm(total=len(todo), desc=f"eval {method.name}", unit=" questions", mininterval=1.0)
    answered = 0

    async def work(question: Question) -> dict[str, Any]:
        started = time.perf_counter()
        fields = await method.answer(ctx, question.item)
        return prediction_row(question, method.name, fields, time.perf_counter() - started)

    def finish(question: Question, row: dict[str, Any]) -> None:
        nonlocal answered
        writer.write(row)
        answered += row["answer"] is not None
        bar.set_postfix(answered=f"{answered / (stats.done + 1):.0%}", failed=stats.failed, refresh=False)

    aborted = await run_jobs(
        todo, work, finish, FAILURES, stats, config.concurrency, config.abort_after_failures, lambda q: q.key, bar
    )
    if aborted:
        raise EvalAborted(
            f"stopped after {config.abort_after_failures} questions in a row failed; last error: {stats.last_error}. "
            f"The {stats.done} questions finished in this run are kept; rerun the same command to resume."
        )


async def run_eval(
    config: EvalRunConfig,
    env: EnvConfig,
    engine_config: EngineConfig,
    generation: GenerationConfig,
    retrieval: RetrievalSource,
    engine: ChatEngine | None = None,
    retriever: Any = None,
) -> RunStats:
    """Evaluate ``config.method`` into ``config.out``; returns this invocation's stats.

    ``engine``/``retriever`` may be given directly (a loaded model, an in-process retriever);
    by default they come from ``engine_config`` and ``retrieval``.
    """
    out = Path(config.out)
    method = get_method(config.method, config)
    predictions = out / PREDICTIONS
    out.mkdir(parents=True, exist_ok=True)
    with _only_writer(out):
        served = await service_identity(retrieval) if method.retrieves and retrieval.url else None
        settings = manifest(config, env, engine_config, generation, retrieval, method, served)
        upgrade_manifest(out / MANIFEST, settings)
        check_manifest(out / MANIFEST, predictions, settings)
        return await _evaluate(config, env, engine_config, generation, retrieval, method, engine, retriever)


async def service_identity(retrieval: RetrievalSource) -> dict[str, Any]:
    """What the retrieval service serves (method, index, encoder, documents), from its /health."""
    try:
        client = AsyncRetrievalClient(retrieval.url, timeout=retrieval.timeout_s, retries=retrieval.retries)
        async with client:
            health = await client.health()
    except RetrievalServiceError as error:
        raise ValueError(
            f"retrieval.url: no retrieval service answers at {retrieval.url} ({error}); start one with "
            "`r3rag retriever serve --config RETRIEVER.yaml`, or give --retrieval.config to retrieve in-process"
        ) from None
    if not isinstance(health, dict):
        raise ValueError(f"retrieval.url: {retrieval.url}/health did not answer a JSON object; is it r3rag's service?")
    served = {key: value for key, value in health.items() if key not in ("status", "uptime_s")}
    return served or {"url": retrieval.url}  # a service that does not describe itself is known by its URL


def upgrade_manifest(path: Path, settings: dict[str, Any]) -> None:
    """Rewrite a ``run.json`` of an older r3rag, which knew a retrieval service by its URL, in today's terms.

    Its rows came from whatever served that URL then; the service now given is taken to be the
    same one (with a warning), so the run resumes instead of being refused.
    """
    if not path.is_file():
        return
    old = json.loads(path.read_text())
    retrieval = old.get("retrieval")
    if not isinstance(retrieval, dict) or "url" not in retrieval:
        return
    url = retrieval.pop("url")
    retrieval["service"] = None
    if url:
        logger.warning("%s knew the retrieval service by its URL (%s); taking the one now given to serve the same "
                       "index", path, url)  # fmt: skip
        retrieval["service"] = (settings.get("retrieval") or {}).get("service")
        if old.get("retriever") == "service":
            old["retriever"] = settings["retriever"]
    path.write_text(json.dumps(old, indent=2) + "\n")


@contextlib.contextmanager
def _only_writer(out: Path) -> Iterator[None]:
    """Hold the run folder's lock: two runs appending to one predictions.jsonl would duplicate questions."""
    with open(out / ".lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(
                f"another `r3rag eval run` is writing into {out}; wait for it, or choose another --out"
            ) from None
        yield


async def _evaluate(
    config: EvalRunConfig,
    env: EnvConfig,
    engine_config: EngineConfig,
    generation: GenerationConfig,
    retrieval: RetrievalSource,
    method: Method,
    engine: ChatEngine | None,
    retriever: Any,
) -> RunStats:
    out = Path(config.out)
    predictions = out / PREDICTIONS
    questions = load_questions(dataset_paths(config.data), config.max_questions)
    done = existing_ids(predictions)
    todo = [q for q in questions if q.key not in done]
    asked = Counter(q.dataset for q in questions)
    stats = RunStats(todo=len(todo), skipped=len(questions) - len(todo))
    if stats.skipped:
        logger.info("resuming: %d questions already in %s, %d to go", stats.skipped, predictions, len(todo))
    with JsonlWriter(out / RUNS_LOG) as log:  # first, so a killed run still says what it was asked
        log.write({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "event": "start", "questions": dict(asked)})
    if not todo:
        return stats

    owned = []
    if retriever is None and method.retrieves:
        retriever = retrieval.open()
        owned.append(retriever)
    if engine is None and not method.answers:  # retrieval only: no model to load
        engine = NoChatEngine()
    if engine is None:
        try:
            engine = make_chat_engine(engine_config, generation, max_connections=config.concurrency)
        except BaseException:  # the model did not load: release the retriever before the error goes up
            for resource in owned:
                await resource.aclose()
            raise
        owned.append(engine)
    busy_before = engine.busy_s
    search = BatchedSearch(retriever) if method.retrieves else _no_retriever
    ctx = MethodContext(engine, env, search, config.step_format, config.naive_topk)
    started = time.perf_counter()
    try:
        with JsonlWriter(predictions) as writer:
            await _run(method, ctx, todo, writer, stats, config)
    finally:
        stats.wall_s = time.perf_counter() - started
        if engine.busy_s is not None:
            stats.busy_s = engine.busy_s - (busy_before or 0.0)
        with JsonlWriter(out / RUNS_LOG) as log:
            log.write({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "event": "end", **asdict(stats)})
        for resource in owned:
            await resource.aclose()
    return stats


def format_stats(stats: RunStats, out: str) -> str:
    share = stats.generation_share
    lines = [
        f"Evaluation -> {out}/{PREDICTIONS}",
        f"  this run: {stats.done:,} questions in {stats.wall_s:.1f} s ({stats.questions_per_s:.2f} questions/s), "
        f"{stats.failed:,} failed, {stats.skipped:,} already done",
    ]
    if share is not None:
        lines.append(f"  the model generated for {share:.1%} of the wall time (harness overhead {1 - share:.1%})")
    lines.append(f"  next: r3rag eval score --run {out}")
    return "\n".join(lines)


def read_manifest(run: Path) -> dict[str, Any]:
    path = run / MANIFEST
    if not path.exists():
        raise ValueError(f"{run} is not an evaluation run (no {MANIFEST}); make one with `r3rag eval run --out {run}`")
    return json.loads(path.read_text())
