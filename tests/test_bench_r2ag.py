"""bench/r2ag.py: the oracle plans read the real annotations, and the real-data part runs end to end."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT, SHARED_DATA, shared_dataset

from r3_env.data import iter_corpus, read_dataset

sys.path.insert(0, str(ROOT / "bench"))

import r2ag


def load(name: str):
    folder = shared_dataset(name)
    items = read_dataset(folder / "dev.jsonl")
    titles = {p.id: p.title for p in iter_corpus(folder / "corpus.jsonl")}
    return items, titles, [r2ag.oracle_plan(item) for item in items]


def test_each_plan_aims_one_query_at_each_gold_passage_it_covers():
    for name in r2ag.DATASETS:
        items, titles, plans = load(name)
        for item, plan in zip(items, plans, strict=True):
            gold = set(item.metadata["supporting_passage_ids"])
            aimed = [g for _, g in plan]
            assert len(aimed) == len(set(aimed)) and set(aimed) <= gold and all(q.strip() for q, _ in plan)
        coverage = r2ag.plan_coverage(items, plans)
        # HotpotQA and MuSiQue annotate every gold paragraph; 2Wiki's triple subjects miss a few titles
        assert coverage["gold_aimed"] >= (1.0 if name != "2wikimultihopqa" else 0.97) * coverage["gold"], name
    items, titles, plans = load("hotpotqa")  # a bridge question: the question, then the bridge entity
    assert plans[0] == [(items[0].question.strip(), "6"), ("Shirley Temple", "1")] and titles["1"] == "Shirley Temple"


def test_musique_sub_questions_get_the_earlier_answers():
    items, _, plans = load("musique")
    for item, plan in zip(items, plans, strict=True):
        hops = item.metadata["question_decomposition"]
        assert not any("#1" in query for query, _ in plan)
        if "#1" in hops[1]["question"]:
            assert hops[0]["answer"] in plan[1][0]


def test_the_real_part_prints_the_tree_against_single_shot_bm25(tmp_path):
    shared_dataset("musique")
    command = [sys.executable, str(ROOT / "bench" / "r2ag.py"), "--datasets", "musique", "--max_questions", "8"]
    command += ["--skip_synthetic", "--work", str(tmp_path), "--data", str(SHARED_DATA)]
    printed = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "| musique | tree: oracle, all at once |" in printed and "| musique | single-shot BM25 @5 |" in printed
    figures = json.loads((tmp_path / "r2ag_bench.json").read_text())["real"]["musique"]
    tree = figures["tree"]["oracle, all at once"]
    assert tree["questions"] == 8 and 0 < tree["recall"] <= 1 and 1 <= tree["iterations"] <= 5
    assert set(figures["single_shot"]) >= {"5", str(figures["matched_k"]["all at once"])}
