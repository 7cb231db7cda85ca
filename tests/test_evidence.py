"""The evidence teacher on real records of ../shared/data: each dataset's annotation becomes the steps,
every query runs through a real BM25 index of the dataset's own paragraphs, and a step that misses its
gold paragraph gets the trajectory rejected."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from conftest import run_r3rag, shared_dataset

from r3_env.coldstart.evidence import EvidenceError, Hop, aimed_hops, evidence_hops
from r3_env.data import QAItem, iter_jsonl, read_dataset
from r3_env.protocol import get_format
from r3_env.records import turns_of
from r3_env.retrieval.index_builder import IndexBuildConfig, build_index

R3 = get_format("r3")


def items_of(name: str) -> list[QAItem]:
    return read_dataset(shared_dataset(name) / "dev.jsonl")


def test_2wiki_hops_are_one_subject_relation_query_per_triple_aimed_at_the_subjects_paragraph():
    items = items_of("2wikimultihopqa")
    first = items[0]  # "Where was the place of burial of Charles Mathew's father?"
    hops = evidence_hops(first)
    assert [h.query for h in hops] == ["Charles James Mathew father", "Sir James Charles Mathew place of burial"]
    # "Charles James Mathew" is the paragraph "Charles Mathew", not "James Charles Mathew" (his father)
    titles = dict(zip(first.metadata["supporting_passage_ids"], first.metadata["supporting_titles"], strict=True))
    assert [titles[h.gold_id] for h in hops] == ["Charles Mathew", "James Charles Mathew"]
    for item in items[:60]:
        hops = evidence_hops(item)
        triples = item.metadata["evidences"]
        assert len(hops) <= len(triples) and len({h.gold_id for h in hops}) == len(hops)
        assert {h.gold_id for h in hops} <= set(item.metadata["supporting_passage_ids"])
        queries = {f"{s} {r}" for s, r, _ in triples}
        assert all(h.query in queries for h in hops)
        if item.metadata["type"] in ("comparison", "bridge_comparison"):  # each compared entity is queried
            assert len(hops) == len(item.metadata["supporting_passage_ids"])


def test_musique_hops_are_the_sub_questions_with_earlier_answers_filled_in():
    for item in items_of("musique")[:40]:
        decomposition = item.metadata["question_decomposition"]
        hops = evidence_hops(item)
        assert len(hops) == len(decomposition)  # one step per sub-question (each has its own paragraph here)
        context = item.metadata["context_passage_ids"]
        for hop, sub in zip(hops, decomposition, strict=True):
            assert hop.gold_id == context[sub["paragraph_support_idx"]]
            assert "#" not in hop.query
            for number in map(int, re.findall(r"#(\d+)", sub["question"])):
                assert decomposition[number - 1]["answer"] in hop.query


def test_hotpotqa_bridge_starts_from_the_question_and_comparison_queries_both_entities():
    for item in items_of("hotpotqa")[:80]:
        hops = evidence_hops(item)
        titles = item.metadata["supporting_titles"]
        assert len(hops) == len(titles) == 2
        if item.metadata.get("type") == "comparison":
            assert [h.query for h in hops] == titles
        elif item.metadata.get("type") == "bridge":
            assert hops[0].query == " ".join(item.question.split())  # the question finds the paragraph it names
            assert hops[1].query in titles  # which names the bridge entity: the other supporting title


def test_an_item_without_an_evidence_annotation_is_refused_naming_the_fields():
    with pytest.raises(EvidenceError, match="question_decomposition.*evidences.*supporting_titles"):
        evidence_hops(QAItem("q1", "Who?", ["x"], {"supporting_passage_ids": ["1"]}))


@pytest.mark.parametrize(("name", "topk"), [("2wikimultihopqa", 5), ("musique", 5), ("hotpotqa", 1)])
def test_synthesis_keeps_exactly_the_chains_whose_every_step_retrieved_its_gold(name, topk, tmp_path):
    folder = shared_dataset(name)
    data = tmp_path / "dev.jsonl"
    data.write_text("".join(line for _, line in zip(range(40), (folder / "dev.jsonl").open(), strict=False)))
    index = build_index(IndexBuildConfig(corpus_path=str(folder / "corpus.jsonl"), save_dir=str(tmp_path / "idx")))
    retriever = tmp_path / "retriever.yaml"
    retriever.write_text(yaml.safe_dump({"retrieval_method": "bm25", "index_path": str(index)}))
    out = tmp_path / "cs"
    args = ["--teacher.kind", "evidence", "--data", str(data), "--retrieval.config", str(retriever)]
    done = run_r3rag("coldstart", "synth", *args, "--samples", "1", "--env.topk", str(topk), "--out", str(out))
    assert done.returncode == 0, done.stderr
    items = {item.id: item for item in read_dataset(data)}
    rows = [row for _, row in iter_jsonl(out / "samples.jsonl")]
    assert len(rows) == 40
    kept = {row["question_id"] for _, row in iter_jsonl(out / "trajectories.jsonl")}
    skipped = 0
    for row in rows:
        hops = evidence_hops(items[row["question_id"]])
        steps = row["steps"]
        searched = [s for s in steps if "query" in s]
        shown = [{d["id"] for d in s["documents"]} for s in searched]
        aimed, remaining = aimed_hops(hops, shown)
        # the steps follow the annotation, leaving out the hops an earlier step's documents already answered
        assert [s["query"] for s in searched] == [h.query for h in aimed]
        order = [hops.index(h) for h in aimed]
        assert order == sorted(set(order))  # in the annotation's order, each hop at most once
        hit = [h.gold_id in documents for h, documents in zip(aimed, shown, strict=True)]
        if row["question_id"] in kept:  # kept: every step brought back the gold paragraph it aimed at
            assert all(hit) and not remaining and steps[-1]["answer"] == row["golden_answers"][0]
            skipped += len(hops) - len(aimed)  # hops an earlier step's documents answered
            # and the trajectory round-trips through the protocol
            for turn in turns_of(row, "row"):
                assert R3.parse_step(R3.render_step(turn.step)) == turn.step
        else:  # rejected: the first step that missed its gold ends it with "unknown"
            assert hit[-1] is False and all(hit[:-1]) and steps[-1]["answer"] == "unknown"
    if name == "2wikimultihopqa":  # a hop whose paragraph an earlier step showed is left out
        assert skipped > 0
    (summary,) = json.loads((out / "summary.json").read_text())["datasets"].values()
    assert summary["trajectories"] == len(kept) > 0
    if topk == 1:  # top-1 misses some gold paragraphs: those chains are rejected
        assert len(kept) < 40
    if "by_type" in summary:
        assert sum(t["questions"] for t in summary["by_type"].values()) == 40


def test_a_step_aims_at_the_first_hop_no_earlier_step_showed():
    hops = [Hop("a", "1", "a"), Hop("b", "2", "b"), Hop("c", "3", "c")]
    assert aimed_hops(hops, []) == ([], hops)
    assert aimed_hops(hops, [{"1", "2"}]) == ([hops[0]], [hops[2]])  # step 1 also answered hop b: c is next
    assert aimed_hops(hops, [{"1", "2"}, {"3"}]) == ([hops[0], hops[2]], [])
    assert aimed_hops(hops, [{"9"}, {"1"}]) == ([hops[0], hops[0]], [hops[1], hops[2]])  # a miss aims again
    # documents shown with the question (env.question_docs) answered hop a: the first step aims at b
    assert aimed_hops(hops, [{"2"}], shown_first={"1"}) == ([hops[1]], [hops[2]])
    assert aimed_hops(hops, [], shown_first={"1", "2", "3"}) == ([], [])


def test_documents_shown_with_the_question_count_as_found_and_the_first_step_says_so():
    """env.question_docs: the evidence teacher aims past the hops those documents answered, or answers at once
    (with an analysis, which the tags format needs before any search)."""
    from r3_env.coldstart.evidence import OPENINGS_AFTER_QUESTION, SHOWN_WITH_QUESTION, EvidenceTeacher
    from r3_env.coldstart.teacher import QUESTION_DOCS_LACK, TeacherConfig, TeacherRequest
    from r3_env.data import Passage

    item = next(item for item in items_of("2wikimultihopqa") if len(evidence_hops(item)) == 2)
    first, second = evidence_hops(item)
    teacher = EvidenceTeacher(TeacherConfig(kind="evidence"), "tags")
    found = (Passage(first.gold_id, "Title\nText"),)
    step = teacher.plan(TeacherRequest([], 0.0, item, [], context=found))
    held = first.fact or first.need
    assert step.query == second.query and step.analysis.startswith(f"{QUESTION_DOCS_LACK} part of the evidence: ")
    # what the shown documents hold is named before what they lack
    assert held in step.analysis and step.analysis.index(held) < step.analysis.index(second.need)
    nothing_held = teacher.plan(TeacherRequest([], 0.0, item, [], context=(Passage("elsewhere", "Title\nText"),)))
    openers = tuple(opening.split("{")[0] for opening in OPENINGS_AFTER_QUESTION)
    assert nothing_held.query == first.query and nothing_held.analysis.startswith(openers)
    assert "part of the evidence" not in nothing_held.analysis
    everything = (*found, Passage(second.gold_id, "Title\nText"))
    answer = teacher.plan(TeacherRequest([], 0.0, item, [], context=everything))
    assert answer.answer == item.golden_answers[0] and answer.analysis == SHOWN_WITH_QUESTION
    # in a format without a reflection section the decision still opens the step
    assert R3.express(answer).analysis.startswith(SHOWN_WITH_QUESTION)
    tags = get_format("tags")
    assert tags.read_turn(tags.render_step(answer), after_documents=False) == answer


def test_under_question_docs_every_step_after_documents_opens_alike_and_decides_at_one_word():
    """After a search's documents the evidence teacher opens with one sentence, then "Now I have" (answer) or
    "Next I need" (search again): worded three ways, the policy copied its first step's opening instead."""
    from r3_env.coldstart.evidence import EvidenceTeacher
    from r3_env.coldstart.teacher import SEARCH_FOUND, TeacherConfig, TeacherRequest
    from r3_env.data import Passage
    from r3_env.protocol import Turn

    item = next(item for item in items_of("musique") if len(evidence_hops(item)) == 3)
    first, second, third = evidence_hops(item)
    teacher = EvidenceTeacher(TeacherConfig(kind="evidence"), "tags")
    shown = (Passage(first.gold_id, "Title\nText"),)
    step1 = teacher.plan(TeacherRequest([], 0.0, item, [], context=shown))
    turn1 = Turn(step1, (Passage(second.gold_id, "Title\nText"),))
    step2 = teacher.plan(TeacherRequest([], 0.0, item, [turn1], context=shown))
    assert step2.query == third.query
    assert R3.express(step2).analysis == f"{SEARCH_FOUND} Next I need {third.need}."
    turn2 = Turn(step2, (Passage(third.gold_id, "Title\nText"),))
    answer = teacher.plan(TeacherRequest([], 0.0, item, [turn1, turn2], context=shown))
    assert answer.answer == item.golden_answers[0]
    assert R3.express(answer).analysis.startswith(f"{SEARCH_FOUND} Now I have every fact it needs")
    # without documents shown with the question the teacher keeps its varied wordings
    plain = teacher.plan(TeacherRequest([], 0.0, item, [Turn(step1, (Passage(first.gold_id, "Title\nText"),))]))
    assert not R3.express(plain).analysis.startswith(SEARCH_FOUND)


def test_under_question_docs_both_teachers_decide_between_answering_and_searching_at_one_word():
    """Every first analysis opens with one sentence and then says "They hold" or "They lack": the policy's
    choice is one token at the data's odds, not the likeliest of several differently worded openings."""
    from r3_env.coldstart import evidence, scripted
    from r3_env.coldstart.teacher import READ_QUESTION_DOCS

    for teacher in (evidence, scripted):
        assert teacher.SHOWN_WITH_QUESTION.startswith(f"{READ_QUESTION_DOCS} They hold ")
        for opening in teacher.OPENINGS_AFTER_QUESTION:
            assert opening.startswith(f"{READ_QUESTION_DOCS} They lack ")
    for opening in evidence.OPENINGS_HOLDING_PART:  # the evidence teacher's, when they hold part of the chain
        assert opening.startswith(f"{READ_QUESTION_DOCS} They lack ")
