"""How well a judge scores: relevance AUC (gold against distractor passages) and correctness, with parse rates.

    .venv/bin/python bench/judge_quality.py [--questions 40] [--judges lexical,smollm2] [--max_tokens 128]

On the shared HotpotQA sample: for each question, one gold supporting passage and one hard
distractor (BM25's best non-gold passage for the question) are judged for relevance to the
question; the golden answer and another question's answer are judged for correctness. A good
relevance judge ranks gold above distractors (AUC 1.0; chance is 0.5). The parse rate is the share
of judgements the reward server could read from the judge's text (the rest fall back). The local
judge runs through the reward server's own ``local`` backend (``reward_server.judges.make_judge``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# bench/ off the path: its reward_server.py would shadow the package
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import SHARED_DATA  # noqa: E402

from r3_env.data import iter_corpus, read_dataset  # noqa: E402
from r3_env.retrieval.bm25 import BM25Retriever, build_bm25_index  # noqa: E402
from reward_server.config import JudgeConfig  # noqa: E402
from reward_server.judges import CorrectnessItem, RelevanceItem, make_judge  # noqa: E402
from reward_server.metrics import RewardMetrics  # noqa: E402

logger = logging.getLogger("judge_quality")


def auc(positives: list[float], negatives: list[float]) -> float:
    """P(a positive scores above a negative), ties counting half (Mann-Whitney)."""
    if not positives or not negatives:
        raise ValueError("AUC needs at least one positive and one negative score")
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def build_items(data: Path, questions: int, work: Path) -> tuple[list[RelevanceItem], list[bool], list, list[bool]]:
    """(relevance items, is-gold flags, correctness items, is-correct flags), alternating gold and not."""
    items = read_dataset(data / "dev.jsonl")[:questions]
    passages = {p.id: p for p in iter_corpus(data / "corpus.jsonl")}
    with BM25Retriever.load(build_bm25_index(data / "corpus.jsonl", work)) as retriever:
        ranked = retriever.search([item.question for item in items], 10)
    relevance, gold_flags, correctness, correct_flags = [], [], [], []
    for number, (item, hits) in enumerate(zip(items, ranked, strict=True)):
        gold = item.metadata["supporting_passage_ids"]
        distractor = next(hit.passage for hit in hits if hit.passage.id not in gold)
        for passage, is_gold in ((passages[gold[0]], True), (distractor, False)):
            relevance.append(RelevanceItem(item.question, item.question, [passage.contents]))
            gold_flags.append(is_gold)
        other = items[(number + 1) % len(items)].golden_answers[0]
        for prediction, is_correct in ((item.golden_answers[0], True), (other, False)):
            correctness.append(CorrectnessItem(item.question, prediction, item.golden_answers))
            correct_flags.append(is_correct)
    return relevance, gold_flags, correctness, correct_flags


async def measure(config: JudgeConfig, relevance, gold_flags, correctness, correct_flags) -> dict:
    judge = make_judge(config, RewardMetrics())
    started = time.perf_counter()
    rel = await judge.relevance(relevance)
    middle = time.perf_counter()
    cor = await judge.correctness(correctness)
    ended = time.perf_counter()
    await judge.close()
    scores = [r.score for r in rel]
    return {
        "relevance_auc": auc(
            [s for s, g in zip(scores, gold_flags, strict=True) if g],
            [s for s, g in zip(scores, gold_flags, strict=True) if not g],
        ),
        "relevance_parsed": sum(not r.fallback for r in rel) / len(rel),
        "relevance_s_per_item": (middle - started) / len(rel),
        "correctness_accuracy": sum((r.score == 1.0) == c for r, c in zip(cor, correct_flags, strict=True)) / len(cor),
        "correctness_parsed": sum(not r.fallback for r in cor) / len(cor),
        "correctness_s_per_item": (ended - middle) / len(cor),
        "fallback_reasons": sorted({r.reason for r in rel + cor if r.fallback}),
    }


def judge_config(name: str, args: argparse.Namespace) -> JudgeConfig:
    if name == "lexical":
        return JudgeConfig(backend="lexical")
    if name == "smollm2":
        from r3_env.model_registry import get_model

        folder = get_model("smollm2-135m-instruct", Path(args.work) / "smollm2")
        name = str(folder)
    # One request at a time on CPU: no deadline, so what is measured is the judge, not the queue.
    return JudgeConfig(backend="local", model_path=name, max_tokens=args.max_tokens, deadline_s=86_400, timeout_s=3_600)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=40, help="HotpotQA dev questions (2 items each per task)")
    parser.add_argument("--judges", default="lexical,smollm2", help="lexical, smollm2, or local model folders")
    parser.add_argument("--max_tokens", type=int, default=128, help="tokens a model judge may write")
    parser.add_argument("--data", default=str(SHARED_DATA), help="the shared data folder")
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench_judge"))
    args = parser.parse_args()
    data = Path(args.data) / "hotpotqa"
    if not (data / "dev.jsonl").exists():
        sys.exit(f"{data}/dev.jsonl is absent: this bench needs the shared HotpotQA sample (--data)")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    built = build_items(data, args.questions, work)
    results = {}
    for name in args.judges.split(","):
        logger.info("judging %d relevance and %d correctness items with %s", len(built[0]), len(built[2]), name)
        results[name] = asyncio.run(measure(judge_config(name, args), *built))
    print(f"\nHotpotQA (shared sample), {args.questions} questions: gold vs BM25's top distractor; right vs wrong")
    print(f"{'judge':<10} {'rel AUC':>8} {'parsed':>7} {'s/item':>7}   {'corr acc':>8} {'parsed':>7} {'s/item':>7}")
    for name, r in results.items():
        print(
            f"{name:<10} {r['relevance_auc']:>8.3f} {r['relevance_parsed']:>7.1%} {r['relevance_s_per_item']:>7.2f}   "
            f"{r['correctness_accuracy']:>8.1%} {r['correctness_parsed']:>7.1%} {r['correctness_s_per_item']:>7.2f}"
        )
        for reason in r["fallback_reasons"][:3]:
            print(f"   fell back: {reason[:110]}")
    (work / "results.json").write_text(json.dumps({"questions": args.questions, "judges": results}, indent=2))
    print(f"\nwritten to {work / 'results.json'}")


if __name__ == "__main__":
    main()
