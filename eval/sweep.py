"""``r3rag eval sweep``: the paper's analyses in one command (accuracy vs max steps, vs top-k, vs retriever).

One run per (retriever, top-k), each with ``sweep.max_steps`` steps, into ``out/METHOD-RETRIEVER-kK``;
the model is loaded once and shared. Scoring every run at cutoffs 1..max_steps gives the
max-steps curve without extra runs (a cutoff is exactly a smaller step limit: see
:mod:`eval.metrics`). Then one report over ``out``. Runs already complete are skipped, so a
killed sweep resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

from eval.engines import EngineConfig, GenerationConfig, make_chat_engine
from eval.run import EvalRunConfig, format_stats, run_eval
from eval.score import ScoreConfig, format_scores, score_run
from r3_env.config import positive_ints
from r3_env.env import EnvConfig
from r3_env.runs import JudgeClientConfig, RetrievalSource

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepConfig:
    retrievers: str = field(
        default="",
        metadata={
            "help": "NAME=retriever.yaml or NAME=http://service, comma-separated (e.g. bm25=bm25.yaml,e5=e5.yaml)"
        },
    )
    topk: str = field(default="1,3,5,10", metadata={"help": "documents per step, comma-separated"})
    max_steps: int = field(default=10, metadata={"help": "step limit of every run (cutoffs 1..N give the curve)"})

    def __post_init__(self) -> None:
        self.sources()
        self.topk_list()
        if self.max_steps < 1:
            raise ValueError(f"sweep.max_steps must be at least 1, got {self.max_steps}")

    def sources(self) -> dict[str, RetrievalSource]:
        sources = {}
        for part in filter(None, (p.strip() for p in self.retrievers.split(","))):
            name, sep, where = part.partition("=")
            if not sep or not name.strip() or not where.strip():
                raise ValueError(f"sweep.retrievers: {part!r} is not NAME=retriever.yaml or NAME=http://host:port")
            where = where.strip()
            url = where if where.startswith(("http://", "https://")) else ""
            sources[name.strip()] = RetrievalSource(url=url, config="" if url else where)
        if not sources:
            raise ValueError("sweep.retrievers is required, e.g. bm25=configs/bm25.yaml,e5=http://127.0.0.1:8000")
        return sources

    def topk_list(self) -> list[int]:
        return positive_ints(self.topk, "sweep.topk")


SECTIONS = [
    ("", EvalRunConfig),
    ("sweep.", SweepConfig),
    ("env.", EnvConfig),
    ("engine.", EngineConfig),
    ("generation.", GenerationConfig),
    ("judge.", JudgeClientConfig),
]


async def run_sweep(
    config: EvalRunConfig,
    sweep: SweepConfig,
    env: EnvConfig,
    engine_config: EngineConfig,
    generation: GenerationConfig,
    judge: JudgeClientConfig,
    engine=None,
) -> int:
    """Run, score and report the sweep under ``config.out``; returns the exit status (1 if a run had failures)."""
    from eval.report import write_report

    root = Path(config.out)
    owned = engine is None
    engine = engine or make_chat_engine(engine_config, generation, max_connections=config.concurrency)
    failed = 0
    try:
        for name, source in sweep.sources().items():
            for k in sweep.topk_list():
                run_name = f"{config.method}-{name}-k{k}"
                run_config = dataclasses.replace(config, out=str(root / run_name), name=run_name, retriever_name=name)
                run_env = dataclasses.replace(env, topk=k, max_steps=sweep.max_steps)
                logger.info("sweep: %s", run_name)
                stats = await run_eval(run_config, run_env, engine_config, generation, source, engine=engine)
                print(format_stats(stats, run_config.out))
                failed += stats.failed
                print(format_scores(await score_run(ScoreConfig(run=run_config.out), judge)))
    finally:
        if owned:
            await engine.aclose()
    for path in write_report(root).values():
        print(path)
    return 1 if failed else 0
