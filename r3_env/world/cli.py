"""``r3rag world``: generate the synthetic multi-hop world and print its statistics."""

from __future__ import annotations

import argparse
from typing import Any

from r3_env.config import add_config_command, configs_from_args
from r3_env.world.build import WorldConfig


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = add_config_command(
        subparsers,
        "world",
        [("", WorldConfig)],
        run,
        help="generate the synthetic multi-hop world (corpus, train and dev questions)",
        description="Write corpus.jsonl, train.jsonl and dev.jsonl (FlashRAG formats) and world.json "
        "(config and statistics) into --out, deterministically from --seed.",
    )
    parser.add_argument("--out", default="runs/world", help="output directory (default: runs/world)")
    parser.add_argument("--overwrite", action="store_true", help="replace a different world already in --out")


def run(args: argparse.Namespace) -> int:
    from r3_env.world.build import generate_world

    [config] = configs_from_args(args, [("", WorldConfig)])
    stats = generate_world(config, args.out, overwrite=args.overwrite)
    print(format_stats(stats, config, args.out))
    return 0


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _counts(counts: dict[Any, int]) -> str:
    return ", ".join(f"{key} {value:,}" for key, value in sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0]))))


def format_stats(stats: dict[str, Any], config: WorldConfig, out: str) -> str:
    lines = [
        f"Synthetic world: seed {config.seed}, {stats['entities']:,} entities -> {out}/",
        f"  passages      {stats['entities']:,} ({_counts(stats['passages_by_kind'])}), "
        f"{stats['passage_words']['mean']} words on average",
        f"  distractors   {sum(stats['distractors'].values()):,} ({_counts(stats['distractors'])})",
        f"  questions     train {stats['questions']['train']:,}, dev {stats['questions']['dev']:,}",
        f"  types         {_counts(stats['question_types'])}",
        "  gold/question " + ", ".join(f"{k} passages: {v:,}" for k, v in stats["gold_passages_per_question"].items()),
        f"  answer kinds  {_counts(stats['answer_kinds'])}",
    ]
    bm25 = stats.get("bm25_top5")
    if bm25:
        by_type = ", ".join(f"{t} {_pct(v)}" for t, v in bm25["all_gold_found_by_type"].items())
        lines.append(
            f"  BM25 top-{bm25['k']}    every gold passage found for {_pct(bm25['all_gold_found'])} of "
            f"{bm25['questions']:,} questions (gold recall {_pct(bm25['gold_recall'])}; {by_type})"
        )
    lines.append(f"  files         corpus.jsonl, train.jsonl, dev.jsonl, world.json ({stats['seconds']} s)")
    return "\n".join(lines)
