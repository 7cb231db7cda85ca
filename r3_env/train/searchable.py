"""``ppo.prompt_filter missing_gold``: train only on the questions where a search has something to find.

An episode starts from its label's start documents and the question's own top ``env.question_docs``
documents (:func:`r3_env.env.question_documents`). When those already hold every gold passage, no
search can find a missing one, so a recall reward cannot pay for searching on that question, and its
samples can only teach the policy to answer without searching. On real questions, the seed whose first
training questions were mostly two-entity comparisons (both pages found by the question itself)
stopped searching under every design tried
(docs/results.md#why-rl-stops-searching-searches-that-seldom-find-anything).

The filter asks the retrieval service for each question's start documents once, before training, as an
episode's start does, and reads each row whole as its label (gold passage ids and start documents), as
the local trainer hands it to the agent. The local trainer runs it on ``ppo.prompts``; the dev questions
(``ppo.eval_prompts``) are left as they are, so the dev reward still measures every kind of question.
For the cluster path (``launch/ppo_r3.sh``), write the filtered prompt file first::

    python -m r3_env.train.searchable --prompts train.jsonl --retriever_url http://HOST:PORT \\
        --question_docs 4 --out train.searchable.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from r3_env.data import Label, QAItem, read_dataset, read_label, write_jsonl
from r3_env.env import EnvConfig, SearchFn, question_documents

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchableQuestions:
    """The questions kept, and how many of the others were left out for each reason."""

    items: list[QAItem]
    all_found: int  # their start documents hold every gold passage
    without_gold: int  # their rows name no gold passage
    unreadable: int  # their labels cannot be read (RolloutContext.label_problem: their episodes score neutral)

    def summary(self, total: int) -> str:
        return (
            f"{len(self.items)} of {total} questions kept ({self.all_found} had every gold passage in their start "
            f"documents, {self.without_gold} name no gold passage, {self.unreadable} have an unreadable label)"
        )


async def missing_gold(
    items: Sequence[QAItem], search: SearchFn, env: EnvConfig, label_of: Callable[[QAItem], object]
) -> SearchableQuestions:
    """The questions whose start documents (``label_of(item)``'s, then the question's top ``env.question_docs``)
    miss at least one gold passage."""
    labels = [read_label(label_of(item)) for item in items]
    readable = [(item, label) for item, label in zip(items, labels, strict=True) if label.problem is None]
    judged = [(item, label) for item, label in readable if label.gold_ids]  # only these are searched
    unreadable, without_gold = len(items) - len(readable), len(readable) - len(judged)

    async def start_ids(item: QAItem, label: Label) -> set[str]:
        given = {doc.id for doc in label.start_documents}
        found = await question_documents(env, search, label.question or item.question, given)
        return given | {doc.id for doc in found}

    starts = await asyncio.gather(*(start_ids(item, label) for item, label in judged))
    kept = [item for (item, label), start in zip(judged, starts, strict=True) if set(label.gold_ids) - start]
    all_found = len(judged) - len(kept)
    if env.question_docs and kept and not all_found and len(kept) > 20:
        logger.warning(
            "ppo.prompt_filter missing_gold: none of %d questions had every gold passage in its start documents; "
            "check that the rows' gold ids name passages of the retriever's corpus",
            len(kept),
        )
    return SearchableQuestions(kept, all_found, without_gold, unreadable)


async def _filter_file(args: argparse.Namespace) -> tuple[int, SearchableQuestions]:
    from r3_env.batching import BatchedSearch
    from r3_env.retrieval.client import AsyncRetrievalClient

    items = read_dataset(args.prompts)
    env = EnvConfig(question_docs=args.question_docs, max_query_chars=args.max_query_chars)
    async with AsyncRetrievalClient(args.retriever_url) as client:
        found = await missing_gold(items, BatchedSearch(client), env, QAItem.to_json)  # one request per 64 questions
    return len(items), found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m r3_env.train.searchable", description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", required=True, help="a FlashRAG dataset .jsonl with gold passage ids")
    parser.add_argument("--retriever_url", required=True, help="the retrieval service the episodes will search")
    parser.add_argument(
        "--question_docs", type=int, required=True, help="env.question_docs of the training run (0: none)"
    )
    parser.add_argument(
        "--max_query_chars", type=int, default=EnvConfig.max_query_chars, help="env.max_query_chars of the run"
    )
    parser.add_argument("--out", required=True, help="the filtered .jsonl to write")
    args = parser.parse_args(argv)
    if args.question_docs < 0:
        parser.error("--question_docs must be 0 or more")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    total, found = asyncio.run(_filter_file(args))
    if not found.items:
        sys.exit(f"{args.prompts}: {found.summary(total)}: nothing to write")
    write_jsonl(args.out, [item.to_json() for item in found.items])
    logger.info("%s -> %s", found.summary(total), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
