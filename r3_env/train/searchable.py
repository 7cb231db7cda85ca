"""``ppo.prompt_filter missing_gold``: train only on the questions where a search has something to find.

An episode starts from its label's start documents and the question's own top ``env.question_docs``
documents. When those already hold every gold passage, no search can find a missing one, so a
recall reward cannot pay for searching on that question, and its samples can only teach the policy
to answer without searching. On real questions, the seed whose first training questions were mostly
two-entity comparisons (both pages found by the question itself) stopped searching under every
design tried (docs/results.md#why-rl-stops-searching-searches-that-seldom-find-anything).

The filter asks the retrieval service for each question's start documents once, before training,
exactly as an episode's start does, and needs the rows' gold passage ids. The local trainer runs it
on ``ppo.prompts``; for the cluster path (``launch/ppo_r3.sh``), write the filtered prompt file first::

    python -m r3_env.train.searchable --prompts train.jsonl --retriever_url http://HOST:PORT \
        --question_docs 4 --out train.searchable.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from r3_env.data import QAItem, read_dataset, read_label, write_jsonl

logger = logging.getLogger(__name__)

Search = Callable[[str, int], Awaitable[Sequence[object]]]  # (query, k) -> hits with .passage.id


@dataclass(frozen=True)
class SearchableQuestions:
    """The questions kept, and how many of the others were left out for each reason."""

    items: list[QAItem]
    all_found: int  # their start documents hold every gold passage
    without_gold: int  # their rows name no gold passage


async def missing_gold(
    items: Sequence[QAItem],
    search: Search,
    question_docs: int,
    max_query_chars: int,
    label_of: Callable[[QAItem], object],
) -> SearchableQuestions:
    """The questions whose start documents (``label_of(item)``'s, then the question's top ``question_docs``) miss at
    least one gold passage."""
    labels = [read_label(label_of(item)) for item in items]

    async def start_ids(item: QAItem, question: str | None) -> set[str]:
        if not question_docs:
            return set()
        hits = await search((question or item.question)[:max_query_chars], question_docs)
        return {hit.passage.id for hit in hits}

    found = await asyncio.gather(*(start_ids(item, label.question) for item, label in zip(items, labels, strict=True)))
    kept, all_found, without_gold = [], 0, 0
    for item, label, ids in zip(items, labels, found, strict=True):
        if not label.gold_ids:
            without_gold += 1
        elif set(label.gold_ids) - ids - {doc.id for doc in label.start_documents}:
            kept.append(item)
        else:
            all_found += 1
    return SearchableQuestions(kept, all_found, without_gold)


async def _filter_file(args: argparse.Namespace) -> tuple[int, SearchableQuestions]:
    from r3_env.retrieval.client import AsyncRetrievalClient

    items = read_dataset(args.prompts)
    async with AsyncRetrievalClient(args.retriever_url) as client:

        async def search(query: str, k: int) -> Sequence[object]:
            return (await client.search([query], k))[0]

        found = await missing_gold(items, search, args.question_docs, args.max_query_chars, QAItem.to_json)
    return len(items), found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m r3_env.train.searchable", description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", required=True, help="a FlashRAG dataset .jsonl with gold passage ids")
    parser.add_argument("--retriever_url", required=True, help="the retrieval service the episodes will search")
    parser.add_argument("--question_docs", type=int, required=True, help="env.question_docs of the training run")
    parser.add_argument("--max_query_chars", type=int, default=1024, help="env.max_query_chars of the training run")
    parser.add_argument("--out", required=True, help="the filtered .jsonl to write")
    args = parser.parse_args(argv)
    if args.question_docs < 0:
        parser.error("--question_docs must be 0 or more (0: no start documents, every question with gold ids kept)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    total, found = asyncio.run(_filter_file(args))
    if not found.items:
        sys.exit(f"kept none of the {total} questions in {args.prompts}: {found.without_gold} name no gold passage "
                 f"and {found.all_found} have every one in their start documents")  # fmt: skip
    write_jsonl(args.out, [item.to_json() for item in found.items])
    logger.info("%d of %d questions kept -> %s (%d had every gold passage in their start documents, %d name no gold "
                "passage)", len(found.items), total, args.out, found.all_found, found.without_gold)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
