"""bench/shown_gold.py: which gold a first query names, and who finds the missing one, over a real BM25 index."""

from __future__ import annotations

import importlib.util
import sys

from conftest import ROOT

from r3_env.data import Passage
from r3_env.retrieval.bm25 import BM25Retriever

# loaded from its file: bench/ on sys.path would shadow the reward_server package with bench/reward_server.py
_spec = importlib.util.spec_from_file_location("shown_gold", ROOT / "bench" / "shown_gold.py")
shown_gold = sys.modules["shown_gold"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shown_gold)
Lookups, count_lookups, title_key = shown_gold.Lookups, shown_gold.count_lookups, shown_gold.title_key

PASSAGES = [
    Passage.from_title_text(
        "a", "Lewiston Maineiacs", "The team played its home games at the Androscoggin Bank Colisee."
    ),
    Passage.from_title_text("b", "Androscoggin Bank Colisee", "The arena in Lewiston seats 3,677 people."),
    Passage.from_title_text("c", "Portland Pirates", "A hockey team from Portland, Maine."),
    Passage.from_title_text("d", "Kiss and Tell (1945 film)", "A comedy starring Shirley Temple."),
    Passage.from_title_text("e", "Shirley Temple", "An American performer and diplomat."),
]


def row(question: str, gold: list[str], shown: list[str], *steps: dict, dataset: str = "hotpotqa") -> dict:
    documents = [{"id": i, "contents": ""} for i in shown]
    return {"dataset": dataset, "question": question, "gold_ids": gold, "question_documents": documents,
            "steps": list(steps)}  # fmt: skip


def search(query: str, *found: str) -> dict:
    return {"analysis": "", "query": query, "documents": [{"id": i, "contents": ""} for i in found]}


def test_counts_the_entity_looked_up_and_who_found_the_missing_gold():
    retriever = BM25Retriever.from_passages(PASSAGES)
    titles = {p.id: p.title for p in PASSAGES}

    def bm25_top(question: str) -> set[str]:
        return {hit.passage.id for hit in retriever.search([question], 1)[0]}

    arena = "How many people does the arena of the Lewiston Maineiacs seat?"
    rows = [
        # looks up the team already shown, then the arena: the policy finds it; so does BM25's top 1
        row(
            arena,
            ["a", "b"],
            ["a"],
            search("Lewiston Maineiacs facts", "c"),
            search("Androscoggin Bank", "b"),
            {"analysis": "", "answer": "3,677"},
        ),
        # names the missing film's star (parenthesised part of the shown title ignored); BM25 misses it
        row("Which film starred the actress of Kiss and Tell?", ["d", "e"], ["d"], search("shirley temple", "e")),
        # answers at once: not searched, nothing found by the policy
        row("Who starred in Kiss and Tell?", ["d", "e"], ["d"], {"analysis": "", "answer": "Shirley Temple"}),
        row(arena, ["a", "b"], ["a", "b"], search("x")),  # both gold shown: left out
        row(arena, ["a", "b"], [], search("x")),  # neither shown: left out
        row(arena, ["a", "b"], ["a"], search("x"), dataset="musique"),  # another dataset: left out
    ]
    counts = count_lookups(rows, titles, bm25_top, "hotpotqa")
    assert bm25_top(arena) == {"b"} and "e" not in bm25_top(rows[1]["question"]) | bm25_top(rows[2]["question"])
    assert counts == Lookups(questions=3, searched=2, names_shown=1, names_missing=1, found_by_policy=2,
                             found_by_bm25=1, found_by_both=1)  # fmt: skip
    assert title_key("Kiss and Tell  (1945 film)") == "kiss and tell"
