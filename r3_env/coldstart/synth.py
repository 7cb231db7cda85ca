"""Algorithm 1: synthesise cold-start trajectories with a teacher, keep the correct ones, best-of-N.

For each question and each of ``samples`` draws (temperatures cycled from ``temperatures``), the
teacher writes one step at a time; :class:`r3_env.env.RetrievalEnv` parses it, retrieves for a
query and shows the documents, exactly as in RL. An answer ends the trajectory; a step that does
not parse ends it as invalid; ``env.max_steps`` retrievals without an answer end it unanswered.
The answer is checked by string match, then by the reward server's judge when ``judge.url`` is set.

Outputs in ``out`` (append-only and resumable: rerun the same command after a kill):

- ``samples.jsonl``: every finished sample, correct or not (see :mod:`r3_env.records`);
- ``trajectories.jsonl``: best-of-N per question: correct, well formed, fewest steps (ties: the
  earliest sample), rebuilt from all samples at the end of every run;
- ``summary.json``: outcomes, acceptance rate, steps and teacher usage per dataset.

A sample whose teacher or service call fails for good is not written, so the next run retries it.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from r3_env.answers import judged_correct
from r3_env.batching import BatchedSearch, Coalescer
from r3_env.chat_client import ChatReply
from r3_env.coldstart.teacher import Teacher, TeacherConfig, TeacherError, TeacherRequest, make_teacher
from r3_env.data import JsonlWriter, existing_ids, iter_jsonl, write_jsonl
from r3_env.env import EnvConfig, RetrievalEnv
from r3_env.episode import Outcome, classify
from r3_env.protocol import MessageRenderer, get_format
from r3_env.records import episode_fields, play, question_documents_of, turns_of
from r3_env.retrieval.base import Hit
from r3_env.retrieval.client import RetrievalServiceError
from r3_env.reward_client import AsyncRewardClient, RewardServiceError, check_answer
from r3_env.runs import (
    JudgeClientConfig,
    Question,
    RetrievalSource,
    check_manifest,
    dataset_paths,
    load_questions,
    run_jobs,
)

logger = logging.getLogger(__name__)

FAILURES = (TeacherError, RetrievalServiceError, RewardServiceError)
MANIFEST = "synth.json"


@dataclass(frozen=True)
class SynthConfig:
    """What to synthesise and where."""

    data: str = field(default="", metadata={"help": "FlashRAG dataset .jsonl files, comma-separated"})
    out: str = field(default="runs/coldstart", metadata={"help": "output folder (resumable)"})
    samples: int = field(default=4, metadata={"help": "samples per question (best-of-N)"})
    temperatures: str = field(default="0.8,0.6,1.0", metadata={"help": "sampling temperatures, cycled over samples"})
    max_questions: int = field(default=0, metadata={"help": "first N questions of each dataset (0: all)"})
    concurrency: int = field(default=16, metadata={"help": "samples in flight"})
    abort_after_failures: int = field(
        default=20, metadata={"help": "stop when this many samples in a row fail for good (teacher or service)"}
    )
    step_format: str = field(default="r3", metadata={"help": "step format the teacher writes"})

    def __post_init__(self) -> None:
        if not self.data:
            raise ValueError("data is required: one or more FlashRAG dataset files, comma-separated")
        if self.samples < 1 or self.concurrency < 1 or self.abort_after_failures < 1:
            raise ValueError("samples, concurrency and abort_after_failures must be at least 1")
        if self.max_questions < 0:
            raise ValueError(f"max_questions must be 0 or more, got {self.max_questions}")
        if get_format(self.step_format).expands_from_context:
            raise ValueError(
                f"step_format {self.step_format!r} writes one expansion step per prompt, not a trajectory: synthesize "
                f"in r3 and convert with r3rag coldstart sft-data --step_format {self.step_format}"
            )
        self.temperature_list()

    def temperature_list(self) -> list[float]:
        try:
            values = [float(part) for part in self.temperatures.split(",") if part.strip()]
        except ValueError:
            raise ValueError(f"temperatures must be numbers separated by commas, got {self.temperatures!r}") from None
        if not values or any(t < 0 for t in values):
            raise ValueError(f"temperatures must be one or more numbers >= 0, got {self.temperatures!r}")
        return values

    def paths(self) -> list[Path]:
        return dataset_paths(self.data)


SECTIONS = [("", SynthConfig), ("env.", EnvConfig), ("teacher.", TeacherConfig), ("retrieval.", RetrievalSource)]
SECTIONS += [("judge.", JudgeClientConfig)]


def fingerprint(config: SynthConfig, env: EnvConfig, teacher: TeacherConfig) -> dict[str, Any]:
    """The settings that change what a sample means; a resumed run must not mix in others.

    Few-shot settings count only when set, so runs recorded before they existed still resume.
    """
    keys = ["kind", "model", "seed", "detour_rate", "max_tokens"]
    if teacher.few_shot:
        keys += ["few_shot", "few_shot_count"]
    return {
        "env": asdict(env),
        "step_format": config.step_format,
        "temperatures": config.temperature_list(),
        "teacher": {key: getattr(teacher, key) for key in keys},
    }


def few_shot_messages(path: str, count: int, renderer: MessageRenderer) -> list[dict[str, str]]:
    """The first ``count`` trajectories of ``path`` as whole conversations (their system prompt left out), to
    stand before each question's own conversation."""
    messages: list[dict[str, str]] = []
    for shown, (number, row) in enumerate(iter_jsonl(path)):
        if shown == count:
            break
        where = f"{path}:{number}"
        turns = renderer.format.express_turns(turns_of(row, where))
        context = question_documents_of(row, where)
        messages += [m for m in renderer.messages(row["question"], turns, context=context) if m["role"] != "system"]
    if not messages:
        raise ValueError(f"teacher.few_shot: {path} holds no trajectory")
    return messages


def with_examples(messages: list[dict[str, str]], examples: list[dict[str, str]]) -> list[dict[str, str]]:
    """``messages`` with the example conversations after its system prompt (or first, when it has none)."""
    head = 1 if messages and messages[0]["role"] == "system" else 0
    return [*messages[:head], *examples, *messages[head:]]


class Synthesizer:
    """Runs samples against one teacher, one retriever and (optionally) one judge, in one event loop."""

    def __init__(
        self,
        config: SynthConfig,
        env: EnvConfig,
        teacher: Teacher,
        retriever: Any,
        judge: AsyncRewardClient | None = None,
        few_shot: tuple[str, int] | None = None,
    ) -> None:
        self.config, self.env, self.teacher = config, env, teacher
        self.renderer = MessageRenderer(config.step_format, doc_chars=env.doc_chars)
        self.examples = few_shot_messages(*few_shot, self.renderer) if few_shot else []
        self.temperatures = config.temperature_list()
        self._search = BatchedSearch(retriever)
        self._judge = (
            Coalescer(lambda items: judge.correctness(items), 64, 0.005, "correctness", RewardServiceError)
            if judge is not None
            else None
        )

    async def search(self, query: str, k: int) -> list[Hit]:
        """The episode's search: coalesced with other samples' queries at the same k."""
        return await self._search(query, k)

    async def sample(self, question: Question, index: int) -> dict[str, Any]:
        """One trajectory for ``question``; raises one of FAILURES when the teacher or a service fails."""
        item, temperature = question.item, self.temperatures[index % len(self.temperatures)]
        env = RetrievalEnv(self.env, self.renderer, self.search, item.question)

        async def write(messages: list[dict[str, str]], turns: list) -> ChatReply:
            messages = with_examples(messages, self.examples)
            return await self.teacher.next_step(
                TeacherRequest(messages, temperature, item, turns, index, self.env.max_steps, env.context)
            )

        usage = await play(env, self.renderer, write)
        fields, verdict = episode_fields(env), None
        if env.answer is not None:
            judge = self._judge.submit if self._judge is not None else None
            verdict = await check_answer(item.question, env.answer, item.golden_answers, judge)
        last = env.steps[-1].step if env.steps else None
        outcome = classify(env.format_error, last, correct=verdict is not None and judged_correct(verdict.score))
        return {
            "id": f"{question.key}#{index}",
            "question_id": item.id,
            "dataset": question.dataset,
            "sample": index,
            "temperature": temperature,
            "question": item.question,
            "golden_answers": item.golden_answers,
            "outcome": outcome.value,
            "verdict": verdict.method if verdict else None,
            **fields,
            "usage": {key: usage[key] for key in ("requests", "prompt_tokens", "completion_tokens")},
            "teacher": self.teacher.name,
        }


def best_of_n(samples: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per question (dataset/id): the correct sample with the fewest steps, the earliest on ties."""
    best: dict[str, dict[str, Any]] = {}
    for row in samples:
        if row.get("outcome") != Outcome.CORRECT.value:
            continue
        key = f"{row['dataset']}/{row['question_id']}"
        current = best.get(key)
        if current is None or (row["num_steps"], row["sample"]) < (current["num_steps"], current["sample"]):
            best[key] = row
    return best


def summarize(samples: list[dict[str, Any]], kept: dict[str, dict[str, Any]], questions: list[Question]) -> dict:
    """Outcomes, acceptance and usage per dataset (over every sample in the file, earlier runs included)."""
    by_dataset: dict[str, dict[str, Any]] = {}
    asked = Counter(q.dataset for q in questions)
    grouped: dict[str, list[dict]] = defaultdict(list)
    for row in samples:
        grouped[row["dataset"]].append(row)
    for dataset in sorted(set(asked) | set(grouped)):
        rows = grouped.get(dataset, [])
        chosen = [row for row in kept.values() if row["dataset"] == dataset]
        sampled = {row["question_id"] for row in rows}
        outcomes = Counter(row["outcome"] for row in rows)
        by_dataset[dataset] = {
            "questions": asked.get(dataset, len(sampled)),
            "questions_sampled": len(sampled),
            "samples": len(rows),
            "outcomes": dict(sorted(outcomes.items())),
            "sample_accuracy": outcomes[Outcome.CORRECT.value] / len(rows) if rows else 0.0,
            "trajectories": len(chosen),
            "acceptance_rate": len(chosen) / len(sampled) if sampled else 0.0,
            "mean_steps_kept": sum(row["num_steps"] for row in chosen) / len(chosen) if chosen else 0.0,
            "verdicts": dict(sorted(Counter(row["verdict"] for row in rows if row["verdict"]).items())),
            "requests": sum(row["usage"]["requests"] for row in rows),
            "prompt_tokens": sum(row["usage"]["prompt_tokens"] for row in rows),
            "completion_tokens": sum(row["usage"]["completion_tokens"] for row in rows),
        }
        typed = [q for q in questions if q.dataset == dataset]
        types = {q.item.id: str(q.item.metadata.get("type") or "(no type)") for q in typed}
        if any(q.item.metadata.get("type") for q in typed):  # per the annotation's type: bridge, 2hop, ...
            kept_ids = {row["question_id"] for row in chosen}
            by_type: dict[str, dict[str, Any]] = {}
            for kind in sorted(set(types.values())):
                ids = {qid for qid, t in types.items() if t == kind} & sampled
                accepted = len(ids & kept_ids)
                by_type[kind] = {
                    "questions": len(ids),
                    "trajectories": accepted,
                    "acceptance_rate": accepted / len(ids) if ids else 0.0,
                }
            by_dataset[dataset]["by_type"] = by_type
    return by_dataset


@dataclass
class RunStats:
    """This run alone: what it sampled, what failed, how fast."""

    todo: int = 0
    done: int = 0
    failed: int = 0
    skipped: int = 0  # already in samples.jsonl from an earlier run
    wall_s: float = 0.0
    last_error: str = ""


async def _run(
    synth: Synthesizer, todo: list[tuple[Question, int]], writer: JsonlWriter, stats: RunStats, config: SynthConfig
) -> None:
    bar = tqdm(total=len(todo), desc="synthesis", unit=" samples", mininterval=1.0)
    correct = 0

    def finish(job: tuple[Question, int], row: dict[str, Any]) -> None:
        nonlocal correct
        writer.write(row)
        correct += row["outcome"] == Outcome.CORRECT.value
        bar.set_postfix(correct=f"{correct / (stats.done + 1):.0%}", failed=stats.failed, refresh=False)

    aborted = await run_jobs(
        todo,
        lambda job: synth.sample(*job),
        finish,
        FAILURES,
        stats,
        config.concurrency,
        config.abort_after_failures,
        lambda job: f"{job[0].key}#{job[1]}",
        bar,
    )
    if aborted:
        raise TeacherError(
            f"stopped after {config.abort_after_failures} samples in a row failed; last error: {stats.last_error}. "
            f"The {stats.done} samples finished in this run are kept; rerun the same command to resume."
        )


async def synthesize(
    config: SynthConfig,
    env: EnvConfig,
    teacher_config: TeacherConfig,
    retrieval: RetrievalSource | None,
    judge: JudgeClientConfig | None = None,
    retriever: Any = None,
    teacher: Teacher | None = None,
) -> tuple[dict[str, Any], RunStats]:
    """Run Algorithm 1 into ``config.out``; returns the summary (all samples so far) and this run's stats.

    ``retriever``/``teacher`` may be given directly (an in-process retriever, a custom teacher);
    by default they come from ``retrieval`` and ``teacher_config``.
    """
    if env.answer_at_limit:  # the environment would write part of the teacher's last step
        raise ValueError("env.answer_at_limit starts the policy's answer step for it; a teacher's transcripts "
                         "are its own steps: leave env.answer_at_limit off for cold-start synthesis")  # fmt: skip
    out = Path(config.out)
    samples_path = out / "samples.jsonl"
    check_manifest(out / MANIFEST, samples_path, fingerprint(config, env, teacher_config))
    questions = load_questions(config.paths(), config.max_questions)
    done = existing_ids(samples_path)
    todo = [(q, k) for q in questions for k in range(config.samples) if f"{q.key}#{k}" not in done]
    stats = RunStats(todo=len(todo), skipped=len(questions) * config.samples - len(todo))
    if stats.skipped:
        logger.info("resuming: %d samples already in %s, %d to go", stats.skipped, samples_path, len(todo))

    owned = []
    if retriever is None:
        retriever = retrieval.open()
        owned.append(retriever)
    if teacher is None:
        teacher = make_teacher(teacher_config, max_connections=config.concurrency, step_format=config.step_format)
        owned.append(teacher)
    client = None
    if judge is not None and judge.url:
        client = AsyncRewardClient(judge.url, timeout=judge.timeout_s, retries=judge.retries)
        owned.append(client)

    started = time.perf_counter()
    try:
        few_shot = (teacher_config.few_shot, teacher_config.few_shot_count) if teacher_config.few_shot else None
        synth = Synthesizer(config, env, teacher, retriever, client, few_shot)
        with JsonlWriter(samples_path) as writer:
            await _run(synth, todo, writer, stats, config)
    finally:
        stats.wall_s = time.perf_counter() - started
        for resource in owned:
            await resource.aclose()

    samples = [row for _, row in iter_jsonl(samples_path)]
    kept = best_of_n(samples)
    order = {q.key: i for i, q in enumerate(questions)}
    chosen = sorted(kept.items(), key=lambda kv: order.get(kv[0], len(order)))
    write_jsonl(out / "trajectories.jsonl", ({**row, "id": key} for key, row in chosen))
    summary = {
        "datasets": summarize(samples, kept, questions),
        "teacher": teacher.name,
        "run": asdict(stats),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary, stats


def format_summary(summary: dict[str, Any], out: str) -> str:
    lines = [
        f"Cold-start synthesis ({summary['teacher']}) -> {out}/",
        f"  {'dataset':<18}{'questions':>10}{'samples':>9}{'correct':>9}{'kept':>7}{'accept':>8}"
        f"{'steps':>7}{'requests':>10}{'tokens in/out':>18}",
    ]
    for name, d in summary["datasets"].items():
        lines.append(
            f"  {name:<18}{d['questions']:>10,}{d['samples']:>9,}{d['sample_accuracy']:>9.1%}"
            f"{d['trajectories']:>7,}{d['acceptance_rate']:>8.1%}{d['mean_steps_kept']:>7.2f}{d['requests']:>10,}"
            f"{d['prompt_tokens']:>10,}/{d['completion_tokens']:,}"
        )
        lines.append(f"    outcomes: {', '.join(f'{k} {v:,}' for k, v in d['outcomes'].items())}")
        if d.get("by_type"):
            kinds = (f"{kind} {t['acceptance_rate']:.1%} of {t['questions']:,}" for kind, t in d["by_type"].items())
            lines.append(f"    accepted by type: {', '.join(kinds)}")
    run = summary["run"]
    rate = run["done"] / run["wall_s"] if run["wall_s"] else 0.0
    lines.append(
        f"  this run: {run['done']:,} samples in {run['wall_s']:.1f} s ({rate:.1f}/s), {run['failed']:,} failed, "
        f"{run['skipped']:,} already done"
    )
    lines.append("  files: samples.jsonl (every sample), trajectories.jsonl (best-of-N), summary.json")
    return "\n".join(lines)
