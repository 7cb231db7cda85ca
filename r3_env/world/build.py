"""Generate a synthetic world into a directory: corpus.jsonl, train.jsonl, dev.jsonl, world.json.

The corpus is written as it is rendered (streaming, with a progress bar); every file goes to a
temporary name and is renamed when complete, and ``world.json`` (config and statistics) is
written last, so an interrupted run leaves no half-written file that looks finished.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from r3_env.data import QAItem, iter_corpus, iter_dataset, write_jsonl
from r3_env.world.graph import World
from r3_env.world.passages import PassageWriter
from r3_env.world.questions import QUESTION_TYPES, generate_questions

logger = logging.getLogger(__name__)

# Bump when a change to the generator changes its output for the same config.
GENERATOR_VERSION = 2

DEFAULT_MIX = "compositional=0.4,comparison=0.22,inference=0.13,bridge_comparison=0.25"


@dataclass(frozen=True)
class WorldConfig:
    """What ``r3rag world`` generates. Question counts of 0 scale with the number of entities."""

    entities: int = field(default=2000, metadata={"help": "entities, one passage each (100 to 1,000,000)"})
    seed: int = field(default=0, metadata={"help": "random seed; the same seed gives the same files"})
    train_questions: int = field(default=0, metadata={"help": "training questions (0: entities/2, at most 50,000)"})
    dev_questions: int = field(default=0, metadata={"help": "dev questions (0: entities/10, 50 to 2,000)"})
    same_name_rate: float = field(default=0.06, metadata={"help": "share of namesakes and remakes"})
    near_duplicate_rate: float = field(
        default=0.12, metadata={"help": "share of siblings, sequels, subsidiaries, twin towns"}
    )
    mix: str = field(default=DEFAULT_MIX, metadata={"help": "question type weights, type=weight,..."})
    bm25_check: int = field(
        default=1000, metadata={"help": "questions (dev first, then train) for the BM25 difficulty check (0: skip)"}
    )

    def __post_init__(self) -> None:
        if not 100 <= self.entities <= 1_000_000:
            raise ValueError(f"entities must be between 100 and 1,000,000, got {self.entities}")
        for name in ("same_name_rate", "near_duplicate_rate"):
            if not 0.0 <= getattr(self, name) <= 0.5:
                raise ValueError(f"{name} must be between 0 and 0.5, got {getattr(self, name)}")
        for name in ("train_questions", "dev_questions", "bm25_check"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more, got {getattr(self, name)}")
        self.question_mix()

    def question_mix(self) -> dict[str, float]:
        mix: dict[str, float] = {}
        for part in self.mix.split(","):
            name, _, weight = part.partition("=")
            name = name.strip()
            if name in mix:
                raise ValueError(f"mix: {name} is given twice")
            if name not in QUESTION_TYPES:
                raise ValueError(f"mix: unknown question type {name!r}; types are {', '.join(QUESTION_TYPES)}")
            try:
                mix[name] = float(weight)
            except ValueError:
                raise ValueError(f"mix: weight of {name} must be a number, got {weight!r}") from None
            if mix[name] < 0:
                raise ValueError(f"mix: weight of {name} must be 0 or more")
        if sum(mix.values()) <= 0:
            raise ValueError("mix: at least one weight must be positive")
        return mix

    @property
    def n_train(self) -> int:
        return self.train_questions or min(50_000, self.entities // 2)

    @property
    def n_dev(self) -> int:
        return self.dev_questions or max(50, min(2_000, self.entities // 10))


class WorldExistsError(FileExistsError):
    pass


def generate_world(config: WorldConfig, out: str | os.PathLike, overwrite: bool = False) -> dict[str, Any]:
    """Write the world for ``config`` into ``out`` and return its statistics.

    If ``out`` already holds a complete world of the same config it is kept and its statistics
    returned; a different world there is an error unless ``overwrite``.
    """
    out = Path(out)
    manifest = out / "world.json"
    if manifest.exists():
        try:
            existing = json.loads(manifest.read_text())
        except ValueError:
            if not overwrite:
                raise WorldExistsError(
                    f"{manifest} is not valid JSON (an interrupted or edited run?); pass --overwrite to "
                    "regenerate the world there or choose another --out"
                ) from None
            existing = {}
        same = existing.get("config") == asdict(config) and existing.get("generator") == GENERATOR_VERSION
        if same and all((out / f).exists() for f in ("corpus.jsonl", "train.jsonl", "dev.jsonl")):
            logger.info("%s already holds this world; keeping it", out)
            return existing["stats"]
        if not overwrite and existing:
            old = existing.get("config") or {}
            changed = [f"{k}={old.get(k)!r}" for k, v in asdict(config).items() if old.get(k) != v]
            if existing.get("generator") != GENERATOR_VERSION:
                changed.append(f"generator version {existing.get('generator')}")
            raise WorldExistsError(
                f"{out} holds a different world ({', '.join(changed)}); "
                "pass --overwrite to replace it or choose another --out"
            )
    out.mkdir(parents=True, exist_ok=True)
    manifest.unlink(missing_ok=True)

    started = time.perf_counter()
    world = World(config.entities, config.seed, config.same_name_rate, config.near_duplicate_rate)
    logger.info("built the entity graph: %d entities in %.1f s", len(world.entities), time.perf_counter() - started)

    writer = PassageWriter(world)
    words: list[int] = []

    def passages():
        for entity in world.entities:
            passage = writer.passage(entity)
            words.append(len(passage.contents.split()))
            yield passage.to_json()

    write_jsonl(out / "corpus.jsonl", passages(), len(world.entities), "passages")

    mix = config.question_mix()
    dev = list(generate_questions(world, config.n_dev, mix, "dev"))
    train = generate_questions(world, config.n_train, mix, "train", exclude={q.signature for q in dev})
    counters: dict[str, Counter] = {"type": Counter(), "hops": Counter(), "answer_kind": Counter()}

    def items(questions, split: str):
        for number, question in enumerate(questions):
            counters["type"][question.type] += 1
            counters["hops"][len(question.hops)] += 1
            counters["answer_kind"][question.answer_kind] += 1
            yield question.to_item(world, f"{split}-{number}").to_json()

    write_jsonl(out / "train.jsonl", items(train, "train"), config.n_train, "train questions")
    write_jsonl(out / "dev.jsonl", items(dev, "dev"), config.n_dev, "dev questions")
    total_weight, total = sum(mix.values()), config.n_train + config.n_dev
    drift = [
        f"{kind} {100 * counters['type'][kind] / total:.0f}% (asked {100 * weight / total_weight:.0f}%)"
        for kind, weight in mix.items()
        if abs(counters["type"][kind] / total - weight / total_weight) > 0.1
    ]
    if drift:
        logger.warning(
            "question types came out as %s: the world runs out of some kinds of question; raise --entities "
            "or lower the question counts for the requested mix",
            ", ".join(drift),
        )

    stats: dict[str, Any] = {
        "entities": len(world.entities),
        "passages_by_kind": world.counts(),
        "distractors": world.variant_counts(),
        "countries": len(world.countries),
        "passage_words": {"mean": round(sum(words) / len(words), 1), "max": max(words)},
        "questions": {"train": config.n_train, "dev": config.n_dev},
        "question_types": dict(counters["type"]),
        "gold_passages_per_question": {str(k): v for k, v in sorted(counters["hops"].items())},
        "answer_kinds": dict(counters["answer_kind"]),
    }
    if config.bm25_check:
        sample = itertools.islice(
            itertools.chain(iter_dataset(out / "dev.jsonl"), iter_dataset(out / "train.jsonl")), config.bm25_check
        )
        stats["bm25_top5"] = bm25_difficulty(out / "corpus.jsonl", list(sample), k=5)
    stats["seconds"] = round(time.perf_counter() - started, 1)
    manifest.write_text(
        json.dumps({"generator": GENERATOR_VERSION, "config": asdict(config), "stats": stats}, indent=2) + "\n"
    )
    return stats


def bm25_difficulty(corpus: Path, items: list[QAItem], k: int) -> dict[str, Any]:
    """How often BM25 with the question alone finds every gold passage in its top ``k``.

    This is the single-shot baseline a step-by-step policy has to beat; the world is meant to be
    neither trivial (1.0) nor hopeless for it. Works on any dataset whose metadata names
    ``supporting_passage_ids`` (and groups by ``type`` where given).
    """
    from r3_env.retrieval.bm25 import BM25Retriever

    retriever = BM25Retriever.from_passages(iter_corpus(corpus))
    results = retriever.search([item.question for item in items], k)
    found, recall, totals = Counter(), Counter(), Counter()
    for item, hits in zip(items, results, strict=True):
        kind = item.metadata.get("type", "all")
        gold = set(item.metadata["supporting_passage_ids"])
        got = gold & {hit.passage.id for hit in hits}
        totals[kind] += 1
        found[kind] += got == gold
        recall[kind] += len(got) / len(gold)
    n = len(items)
    return {
        "questions": n,
        "k": k,
        "all_gold_found": round(sum(found.values()) / n, 4) if n else None,
        "gold_recall": round(sum(recall.values()) / n, 4) if n else None,
        "all_gold_found_by_type": {t: round(found[t] / totals[t], 4) for t in sorted(totals)},
    }
