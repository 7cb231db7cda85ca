"""How well a judge scores: relevance AUC (gold against distractor passages) and correctness, with parse rates.

    .venv/bin/python bench/judge_quality.py [--skip 40] [--questions 360] [--judges lexical,dense,reward_cpu]

On the shared HotpotQA sample, questions ``skip`` to ``skip + questions``: every gold supporting
passage of a question is judged for relevance to the question (the question is the query), against
two kinds of distractor: BM25's best non-gold passage for the question (``bm25``: it shares the
question's words, the hardest case for lexical judges) and the paragraphs HotpotQA itself ships as
the question's distractors (``dataset``). AUC is pooled over questions: a judge must rank any gold
passage above any distractor (1.0; chance is 0.5). The golden answer and another question's answer
are judged for correctness. The parse rate is the share of judgements the reward server could read
from the judge's text (the rest fall back). Judges run through the reward server's own factory
(``reward_server.judges.make_judge``); ``reward_cpu`` is ``launch/configs/reward_cpu.yaml``'s judge,
and any ``*.yaml`` given is read the same way. The dense judge's weights were chosen on questions
0-39, so the default ``--skip 40`` measures on questions it was not tuned on.
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

from r3_env.config import load_yaml  # noqa: E402
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


DISTRACTORS = ("bm25", "dataset")


def build_items(
    data: Path, skip: int, questions: int, work: Path
) -> tuple[list[RelevanceItem], list[str], list, list[bool]]:
    """(relevance items, each one's kind: gold or a distractor kind, correctness items, is-correct flags)."""
    every = read_dataset(data / "dev.jsonl")
    items = every[skip : skip + questions]
    if not items:
        raise SystemExit(f"--skip {skip} leaves no questions: the sample has {len(every)}")
    passages = {p.id: p for p in iter_corpus(data / "corpus.jsonl")}
    with BM25Retriever.load(build_bm25_index(data / "corpus.jsonl", work)) as retriever:
        ranked = retriever.search([item.question for item in items], 10)
    relevance, kinds, correctness, correct_flags = [], [], [], []
    for number, (item, hits) in enumerate(zip(items, ranked, strict=True)):
        gold = item.metadata["supporting_passage_ids"]
        judged = [(passages[pid], "gold") for pid in gold]
        judged.append((next(hit.passage for hit in hits if hit.passage.id not in gold), "bm25"))
        judged += [(passages[pid], "dataset") for pid in item.metadata["context_passage_ids"] if pid not in gold]
        for passage, kind in judged:
            relevance.append(RelevanceItem(item.question, item.question, [passage.contents]))
            kinds.append(kind)
        other = items[(number + 1) % len(items)].golden_answers[0]
        for prediction, is_correct in ((item.golden_answers[0], True), (other, False)):
            correctness.append(CorrectnessItem(item.question, prediction, item.golden_answers))
            correct_flags.append(is_correct)
    return relevance, kinds, correctness, correct_flags


async def measure(config: JudgeConfig, relevance, kinds, correctness, correct_flags) -> dict:
    judge = make_judge(config, RewardMetrics())
    started = time.perf_counter()
    rel = await judge.relevance(relevance)
    middle = time.perf_counter()
    cor = await judge.correctness(correctness)
    ended = time.perf_counter()
    await judge.close()
    by_kind: dict[str, list[float]] = {}
    for result, kind in zip(rel, kinds, strict=True):
        by_kind.setdefault(kind, []).append(result.score)
    return {
        "relevance_auc": {kind: auc(by_kind["gold"], by_kind[kind]) for kind in DISTRACTORS},
        "relevance_parsed": sum(not r.fallback for r in rel) / len(rel),
        "relevance_s_per_item": (middle - started) / len(rel),
        "correctness_accuracy": sum((r.score == 1.0) == c for r, c in zip(cor, correct_flags, strict=True)) / len(cor),
        "correctness_parsed": sum(not r.fallback for r in cor) / len(cor),
        "correctness_s_per_item": (ended - middle) / len(cor),
        "fallback_reasons": sorted({r.reason for r in rel + cor if r.fallback}),
    }


def judge_config(name: str, args: argparse.Namespace) -> JudgeConfig:
    if name in ("lexical", "dense"):
        return JudgeConfig(backend=name, device="cpu")
    if name == "reward_cpu" or name.endswith(".yaml"):
        path = ROOT / "launch" / "configs" / "reward_cpu.yaml" if name == "reward_cpu" else Path(name)
        return JudgeConfig(**load_yaml(path).get("judge", {}))
    if name == "smollm2":
        from r3_env.model_registry import get_model

        folder = get_model("smollm2-135m-instruct", Path(args.work) / "smollm2")
        name = str(folder)
    # One request at a time on CPU: no deadline, so what is measured is the judge, not the queue.
    return JudgeConfig(backend="local", model_path=name, max_tokens=args.max_tokens, deadline_s=86_400, timeout_s=3_600)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip", type=int, default=40, help="leave out the first questions (the tuning sample)")
    parser.add_argument("--questions", type=int, default=360, help="HotpotQA dev questions judged after --skip")
    parser.add_argument(
        "--judges",
        default="lexical,dense,reward_cpu",
        help="lexical, dense, reward_cpu, smollm2, a reward .yaml, or local model folders",
    )
    parser.add_argument("--max_tokens", type=int, default=128, help="tokens a model judge may write")
    parser.add_argument("--data", default=str(SHARED_DATA), help="the shared data folder")
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench_judge"))
    args = parser.parse_args()
    data = Path(args.data) / "hotpotqa"
    if not (data / "dev.jsonl").exists():
        sys.exit(f"{data}/dev.jsonl is absent: this bench needs the shared HotpotQA sample (--data)")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    built = build_items(data, args.skip, args.questions, work)
    results = {}
    for name in args.judges.split(","):
        logger.info("judging %d relevance and %d correctness items with %s", len(built[0]), len(built[2]), name)
        results[name] = asyncio.run(measure(judge_config(name, args), *built))
    asked = len(built[2]) // 2
    print(f"\nHotpotQA (shared sample), questions {args.skip}-{args.skip + asked - 1}: every gold passage against")
    print("BM25's best distractor (bm25) and the dataset's own distractors (dataset); right vs wrong answer")
    print(f"{'judge':<12} {'AUC bm25':>8} {'dataset':>8} {'parsed':>7} {'s/item':>7}   {'corr acc':>8} {'parsed':>7}")
    for name, r in results.items():
        aucs = r["relevance_auc"]
        print(
            f"{name:<12} {aucs['bm25']:>8.3f} {aucs['dataset']:>8.3f} {r['relevance_parsed']:>7.1%} "
            f"{r['relevance_s_per_item']:>7.3f}   {r['correctness_accuracy']:>8.1%} {r['correctness_parsed']:>7.1%}"
        )
        for reason in r["fallback_reasons"][:3]:
            print(f"   fell back: {reason[:110]}")
    summary = {"skip": args.skip, "questions": asked, "judges": results}
    (work / "results.json").write_text(json.dumps(summary, indent=2))
    print(f"\nwritten to {work / 'results.json'}")


if __name__ == "__main__":
    main()
