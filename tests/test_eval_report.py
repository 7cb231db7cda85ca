"""The report over small real runs: tables and curves from the scores, and the HTML page in headless Chromium.

The runs are made by ``r3rag eval run``'s code with the scripted tiny model (see tests/test_eval.py)
and scored by ``r3rag eval score``'s. The page is loaded in Debian's Chromium driven by
playwright-core (``bash scripts/setup_browser.sh``), which reads the tables and plots and works
the trajectory browser's filters as a user would.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, answer_step, query_step, scripted_engine

from eval.engines import EngineConfig, GenerationConfig
from eval.report import write_report
from eval.run import EvalRunConfig, run_eval
from eval.score import ScoreConfig, score_run
from r3_env.data import iter_jsonl, write_jsonl
from r3_env.env import EnvConfig
from r3_env.runs import JudgeConfig, RetrievalSource

HOSTILE = "</script><b>x</b> & <!-- not a comment"
CHROMIUM = Path("/usr/bin/chromium")
PLAYWRIGHT = ROOT / "tests" / "browser" / "node_modules" / "playwright-core"


@pytest.fixture(scope="module")
def runs(eval_world, eval_tiny, tmp_path_factory):
    """Three scored runs (r3 at top-k 2 and 3, naive RAG) over four questions, and one unscored run."""
    root = tmp_path_factory.mktemp("report")
    items = eval_world["items"][:4]
    hops = [hop["question"] for hop in items[0].metadata["question_decomposition"]]
    queries = [hops[0], hops[-1]]  # the gold decomposition's questions: BM25 finds gold passages with them
    plans = {
        items[0].question: [
            query_step("first", queries[0]),
            query_step("second", queries[1]),
            answer_step("done", items[0].golden_answers[0]),
        ],
        items[1].question: [query_step("look", "river town"), answer_step("guess", "Nobody In Particular")],
        items[2].question: [answer_step("known", items[2].golden_answers[0])],
    }  # the fourth question generates freely: an unparsed step
    source = RetrievalSource(config=eval_world["retriever"])
    engine = scripted_engine(eval_tiny, plans)
    for name, method, topk in (("r3-k2", "r3", 2), ("r3-k3", "r3", 3), ("naive", "naive_rag", 5)):
        config = EvalRunConfig(data=str(eval_world["dev"]), out=str(root / name), method=method, max_questions=4,
                               naive_topk=4)  # fmt: skip
        env = EnvConfig(topk=topk, max_steps=4)
        asyncio.run(
            run_eval(config, env, EngineConfig(model=str(eval_tiny)), GenerationConfig(), source, engine=engine)
        )
    rows = [row for _, row in iter_jsonl(root / "r3-k2" / "predictions.jsonl")]
    for row in rows:  # a hostile document and question, to prove the page escapes what it shows
        if row["question"] == items[1].question:
            row["steps"][0]["documents"][0]["contents"] = f"Hostile title\n{HOSTILE}"
    write_jsonl(root / "r3-k2" / "predictions.jsonl", rows)
    for name in ("r3-k2", "r3-k3", "naive"):
        asyncio.run(score_run(ScoreConfig(run=str(root / name)), JudgeConfig()))
    shutil.copytree(root / "naive", root / "unscored")
    (root / "unscored" / "scores.json").unlink()
    return {"root": root, "items": items, "queries": queries}


def test_tables_and_curves_come_from_the_scores(runs, caplog):
    root = runs["root"]
    with caplog.at_level(logging.WARNING):
        paths = write_report(root)
    assert "unscored has no scores.json" in caplog.text
    tables = json.loads(paths["json"].read_text())
    assert tables["metric"] == "em" and tables["datasets"] == ["world"]
    by_name = {row["name"]: row for row in tables["main"]}
    assert set(by_name) == {"r3-k2", "r3-k3", "naive"}
    for name, row in by_name.items():
        final = json.loads((root / name / "scores.json").read_text())["datasets"]["world"]["final"]
        assert row["world.em"] == final["em"] and row["world.f1"] == final["f1"] and row["world.acc"] is None
    assert by_name["r3-k2"]["world.em"] == 0.5  # questions 0 and 2 answered right, 1 wrong, 3 unparsed
    assert by_name["r3-k2"]["run"] == "r3 (bm25) r3-k2"  # two r3 (bm25) runs: their names tell them apart
    [curve] = tables["topk_curves"]
    assert [x for x, _ in curve["points"]] == [2, 3] and curve["series"] == "r3 (bm25)"
    steps = {c["run"]: dict(c["points"]) for c in tables["steps_curves"]}
    assert steps["r3 (bm25) r3-k2"] == {1: 0.25, 2: 0.25, 3: 0.5, 4: 0.5}  # the right answers at steps 1 and 3
    markdown = paths["md"].read_text()
    assert "| run | world ACC | world F1 | world EM | average ACC | average F1 | average EM |" in markdown
    assert "| r3 (bm25) r3-k2 | – |" in markdown and "| 50.0 |" in markdown
    page = paths["html"].read_text()
    assert HOSTILE not in page and "<b>x</b>" not in page  # escaped inside the embedded JSON
    assert "http://" not in page and "https://" not in page  # self-contained


def test_no_scored_run_names_the_fix(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "run.json").write_text("{}")
    with pytest.raises(ValueError, match="r3rag eval score --run"):
        write_report(tmp_path)


def test_the_page_in_headless_chromium(runs, tmp_path):
    if not CHROMIUM.exists() or not PLAYWRIGHT.exists():
        pytest.skip("Chromium or playwright-core is missing: run `bash scripts/setup_browser.sh`")
    root, items = runs["root"], runs["items"]
    paths = write_report(root, tmp_path / "report")
    labels = {name: f"r3 (bm25) {name}" for name in ("r3-k2", "r3-k3")} | {"naive": "naive_rag (bm25)"}
    questions = []
    for name, label in labels.items():
        verdicts = {row["id"]: row["correct"] for _, row in iter_jsonl(root / name / "question_scores.jsonl")}
        predictions = iter_jsonl(root / name / "predictions.jsonl")
        questions += [(label, row["num_steps"], verdicts[row["id"]]) for _, row in predictions]
    filters = [{"dataset": "world", "verdict": "correct"}, {"verdict": "wrong"}, {"steps": 1},
               {"run": labels["r3-k2"], "verdict": "correct"}, {"run": labels["naive"], "steps": 2}]  # fmt: skip

    def expected(setting: dict) -> int:
        return sum(
            setting.get("run", run) == run and setting.get("steps", steps) == steps
            and setting.get("verdict", "correct" if correct else "wrong") == ("correct" if correct else "wrong")
            for run, steps, correct in questions
        )  # fmt: skip

    (tmp_path / "filters.json").write_text(json.dumps(filters))
    env = {"PATH": "/usr/bin:/bin", "GOLD_RUN": labels["r3-k2"], "GOLD_QUESTION": items[0].question,
           "HOSTILE_QUESTION": items[1].question}  # fmt: skip
    result = subprocess.run(
        ["node", str(ROOT / "tests" / "browser" / "check_report.mjs"), str(paths["html"]), str(tmp_path / "out.json"),
         str(tmp_path / "filters.json"), str(tmp_path / "page.png")],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads((tmp_path / "out.json").read_text())
    assert seen["errors"] == [] and all(url.startswith("file://") for url in seen["requests"])
    assert seen["mainRows"] == 3 and seen["retrievalRows"] == 3
    assert seen["stepsLines"] == 3 and seen["stepsDots"] == 12 and seen["topkLines"] == 1
    assert seen["trajectories"] == 12 and seen["countText"] == "12 of 12 shown"
    for got in seen["filtered"]:
        assert got["visible"] == expected(got["setting"]), got
        assert got["countText"] == f"{got['visible']} of 12 shown"
    assert seen["stepTexts"] == runs["queries"]  # the trajectory's queries, in order
    gold = set(items[0].metadata["supporting_passage_ids"])
    [row] = [row for _, row in iter_jsonl(root / "r3-k2" / "predictions.jsonl") if row["question"] == items[0].question]
    shown = [doc["id"] for step in row["steps"] for doc in step.get("documents", [])]
    assert seen["goldDocsVisible"] == len([d for d in shown if d in gold]) > 0
    assert seen["goldMarks"] and all(mark == "★ gold" for mark in seen["goldMarks"])
    assert any(HOSTILE in text for text in seen["hostileText"]) and seen["injectedBold"] == 0
    assert (tmp_path / "page.png").stat().st_size > 10_000
