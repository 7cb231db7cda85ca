"""Which entity does a policy look up when the question's own documents already hold one of its two gold passages?

    .venv/bin/python bench/shown_gold.py --demo DEMO_OUT [--k 6] [--dataset hotpotqa] PREDICTIONS.jsonl ...

For an evaluation under ``env.question_docs`` (``predictions.jsonl`` of an ``r3rag demo --data`` evaluation or a
``bench/rl_gain.py`` arm): on the questions of ``--dataset`` with two gold passages, exactly one of them among the
documents shown with the question, it counts

- how many episodes searched, and how many first queries name the title of the gold passage already shown, or of
  the missing one (titles compared in lower case, parenthesised parts dropped);
- how often the missing passage was found by the policy's searches, and how often single-shot BM25 with the
  question finds it in its top ``--k`` (the demo's index): the comparison ``bench/rl_gain.py``'s table makes in
  Full-Recall, narrowed to the questions where a search decides it. Under ``env.dedup_docs`` a search that
  repeats the question gets BM25's next documents, so a policy beats BM25 here only with queries that find what
  the question's next results miss.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from r3_env.coldstart.evidence import title_key

logger = logging.getLogger("shown_gold")


@dataclass
class Lookups:
    """Counts over the questions holding one of their two gold passages from the start."""

    questions: int = 0
    searched: int = 0
    names_shown: int = 0  # first query names the shown gold's title
    names_missing: int = 0  # first query names the missing gold's title
    found_by_policy: int = 0  # some search showed the missing gold
    found_by_bm25: int = 0  # single-shot BM25 with the question has it in its top k
    found_by_both: int = 0


def count_lookups(
    rows: Iterable[dict], titles: dict[str, str], bm25_top: Callable[[str], set[str]], dataset: str
) -> Lookups:
    """``titles``: passage id to title; ``bm25_top``: a question's top-k passage ids."""
    counts = Lookups()
    for row in rows:
        shown = {doc["id"] for doc in row.get("question_documents") or []}
        gold = row.get("gold_ids") or []
        held = [g for g in gold if g in shown]
        if row.get("dataset") != dataset or len(gold) != 2 or len(held) != 1:
            continue
        counts.questions += 1
        missing = next(g for g in gold if g not in shown)
        steps = row.get("steps") or []
        searches = [step for step in steps if step.get("query")]
        if steps and steps[0].get("query"):
            query = title_key(steps[0]["query"])
            counts.searched += 1
            counts.names_shown += title_key(titles[held[0]]) in query
            counts.names_missing += title_key(titles[missing]) in query
        by_policy = any(missing in {doc["id"] for doc in step.get("documents") or []} for step in searches)
        by_bm25 = missing in bm25_top(row["question"])
        counts.found_by_policy += by_policy
        counts.found_by_bm25 += by_bm25
        counts.found_by_both += by_policy and by_bm25
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", required=True, help="the r3rag demo --data folder (its data/ and index/)")
    parser.add_argument("--k", type=int, default=6, help="single-shot BM25's documents (the run's own, rounded)")
    parser.add_argument("--dataset", default="hotpotqa")
    parser.add_argument("predictions", nargs="+", help="predictions.jsonl of evaluations under env.question_docs")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from r3_env.data import iter_corpus, iter_jsonl
    from r3_env.retrieval.bm25 import BM25Retriever

    demo = Path(args.demo)
    titles = {p.id: p.title for p in iter_corpus(demo / "data" / "corpus.jsonl")}
    retriever = BM25Retriever.load(demo / "index" / "bm25")

    def bm25_top(question: str) -> set[str]:
        return {hit.passage.id for hit in retriever.search([question], args.k)[0]}

    for path in args.predictions:
        rows = (row for _, row in iter_jsonl(path))
        counts = count_lookups(rows, titles, bm25_top, args.dataset)
        logger.info("%s: %s", path, json.dumps(asdict(counts)))


if __name__ == "__main__":
    main()
