"""The report over hand-made scored runs: tables and curves from the scores, and the page in headless Chromium.

Three runs over two datasets (r3 with BM25 at top-k 5 and 3, judged; naive RAG, not judged) and
one unscored run. Their predictions are written here; scores.json and question_scores.jsonl come
from ``eval.score.score_rows`` over them, so the files are what ``r3rag eval score`` writes. The
expected numbers below are worked out by hand from the outcomes in ``RUNS``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

from eval.report import write_report
from eval.score import score_rows
from r3_env.data import write_jsonl

HOSTILE = "</script><b>x</b> & <!-- not a comment"
CHROMIUM = Path("/usr/bin/chromium")
PLAYWRIGHT = ROOT / "tests" / "browser" / "node_modules" / "playwright-core"
CUTOFFS = [1, 2, 3, 4, 5]

# (id, question, golden answers, gold passage ids) per dataset.
QUESTIONS = {
    "hotpotqa": [
        ("h1", "Where was the director of Blue Harbour born?", ["Paris"], ["h1-g0", "h1-g1"]),
        ("h2", "Were Ann Lee and Bo Chan of the same nationality?", ["yes"], ["h2-g0", "h2-g1"]),
        ("h3", "Who founded the maker of the <i>Zephyr</i> kettle?", ["John Smith"], ["h3-g0"]),
    ],
    "2wikimultihopqa": [
        ("w1", "Where did the author of Green Lines die?", ["Paris"], ["w1-g0", "w1-g1"]),
        ("w2", "Which film came out first, Up North or Down South?", ["Up North"], ["w2-g0", "w2-g1"]),
        ("w3", "What is the capital of France?", ["Paris"], []),
    ],
}
# Per run: (method, top-k, question id -> (queries before the answer, outcome)). Outcomes: "right"
# (exact), "close" (the judge accepts it, EM does not), "wrong", None (the last step did not parse).
RUNS = {
    "judged/r3-bm25-k5": ("r3", 5, {
        "h1": (2, "right"), "h2": (1, "wrong"), "h3": (1, "right"),
        "w1": (2, "close"), "w2": (3, None), "w3": (0, "right"),
    }),
    "judged/r3-bm25-k3": ("r3", 3, {
        "h1": (2, "right"), "h2": (1, "wrong"), "h3": (2, "wrong"),
        "w1": (2, "wrong"), "w2": (3, None), "w3": (0, "right"),
    }),
    "baselines/naive-bm25": ("naive_rag", 5, {
        "h1": (1, "wrong"), "h2": (1, "right"), "h3": (1, "right"),
        "w1": (1, "wrong"), "w2": (1, "wrong"), "w3": (1, "right"),
    }),
}  # fmt: skip
LABELS = {
    "judged/r3-bm25-k5": "r3 (bm25) r3-bm25-k5",
    "judged/r3-bm25-k3": "r3 (bm25) r3-bm25-k3",
    "baselines/naive-bm25": "naive_rag (bm25)",
}
LONG_TEXT = "The director was born in Paris. " * 20  # longer than the page's 300-character preview


def manifest(folder: str, method: str, topk: int) -> dict:
    return {
        "name": folder.split("/")[-1],
        "method": method,
        "retriever": "bm25",
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "engine": "hf",
        "naive_topk": topk if method == "naive_rag" else None,
        "env": {"max_steps": 5, "topk": topk},
        "datasets": ["hotpotqa", "2wikimultihopqa"],
        "generation": {"temperature": 0.0},
    }


def documents(qid: str, step: int, topk: int, gold: list[str]) -> list[dict]:
    """Step ``step``'s documents: the step-th gold passage first (if any), then distractors."""
    text = LONG_TEXT if qid == "h1" else "A fact."
    docs = [{"id": gold[step], "contents": f"Gold page {step}\n{text}"}] if step < len(gold) else []
    docs += [{"id": f"{qid}-d{step}-{j}", "contents": f"Other page {j}\nUnrelated text."} for j in range(topk)]
    return docs[:topk]


def prediction(method: str, dataset: str, question: tuple, queries: int, outcome: str | None, topk: int) -> dict:
    qid, text, golden, gold = question
    steps = []
    for step in range(queries):
        steps.append({"analysis": f"Step {step} needs a fact.", "query": f"{qid} query {step}",
                      "documents": documents(qid, step, topk, gold)})  # fmt: skip
    short = {"right": golden[0], "close": f"{golden[0]} indeed", "wrong": "Nobody", None: ""}[outcome]
    row = {"id": f"{dataset}/{qid}", "question_id": qid, "dataset": dataset, "method": method, "question": text,
           "golden_answers": golden, "gold_ids": gold, "steps": steps}  # fmt: skip
    if outcome is None:
        row["invalid"] = {"output": "I am not sure what to do <b>now</b>", "reason": "missing_query"}
    else:
        steps.append({"analysis": "I know it now.", "answer": f"The answer is {short}."})
    return row | {"answer": None if outcome is None else f"The answer is {short}.", "prediction": short,
                  "num_steps": len(steps) + (outcome is None), "num_retrievals": queries,
                  "num_docs": sum(len(s.get("documents", [])) for s in steps), "time_s": 0.5}  # fmt: skip


def verdict(outcome: str | None) -> dict:
    score = 1.0 if outcome in ("right", "close") else 0.0
    return {"score": score, "method": "match" if outcome == "right" else "judge", "fallback": False}


def write_run(root: Path, folder: str, spec: tuple, scored: bool = True) -> None:
    """A run folder as `r3rag eval run` and then (if ``scored``) `r3rag eval score` leave it."""
    method, topk, plan = spec
    info = manifest(folder, method, topk)
    run = root / folder
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps(info))
    rows = [prediction(method, name, q, *plan[q[0]], topk) for name, qs in QUESTIONS.items() for q in qs]
    if folder.endswith("k5"):  # a document that would end the page's <script> if it were not escaped
        rows[1]["steps"][0]["documents"][-1]["contents"] = f"Hostile page\n{HOSTILE}"
    write_jsonl(run / "predictions.jsonl", rows)
    if not scored:
        return
    judged = method == "r3"
    verdicts = {row["id"]: verdict(plan[row["question_id"]][1]) for row in rows if row["answer"]} if judged else None
    body, per_question = score_rows(rows, CUTOFFS, verdicts)
    judge = "Qwen/Qwen2.5-72B-Instruct" if judged else None
    (run / "scores.json").write_text(json.dumps({"run": info, "judge": judge, **body}))
    write_jsonl(run / "question_scores.jsonl", per_question)


@pytest.fixture
def root(tmp_path) -> Path:
    """The three scored runs and an unscored copy of the naive one, under tmp_path/runs."""
    root = tmp_path / "runs"
    for folder, spec in RUNS.items():
        write_run(root, folder, spec)
    write_run(root, "baselines/unscored", RUNS["baselines/naive-bm25"], scored=False)
    return root


def embedded_trajectories(page: str) -> list[dict]:
    start = page.index('<script type="application/json" id="trajectory-data">')
    body = page[page.index(">", start) + 1 : page.index("</script>", start)]
    return json.loads(body)


def test_tables_come_from_the_scores(root, caplog):
    with caplog.at_level(logging.WARNING):
        paths = write_report(root)
    assert set(paths) == {"md", "json", "html"} and all(path.parent == root for path in paths.values())
    assert "unscored has no scores.json" in caplog.text and "r3rag eval score --run" in caplog.text
    tables = json.loads(paths["json"].read_text())
    assert tables["metric"] == "em"  # naive RAG was not judged: the curves cannot use ACC
    assert tables["datasets"] == ["hotpotqa", "2wikimultihopqa"]  # run.json's order, as in the paper
    assert [row["run"] for row in tables["main"]] == [LABELS[folder] for folder in sorted(RUNS)]
    for folder, row in zip(sorted(RUNS), tables["main"], strict=True):
        scores = json.loads((root / folder / "scores.json").read_text())
        for name in ("hotpotqa", "2wikimultihopqa"):
            final = scores["datasets"][name]["final"]
            assert row["scores"][name] == {key: final[key] for key in ("acc", "f1", "em")}
        assert row["scores"]["average"]["em"] == scores["average"]["final"]["em"]
    k5 = next(row for row in tables["main"] if row["name"] == "r3-bm25-k5")
    assert k5["scores"]["2wikimultihopqa"] == pytest.approx({"acc": 2 / 3, "f1": 5 / 9, "em": 1 / 3})

    markdown = paths["md"].read_text()
    header = ["run"] + [f"{d} {m}" for d in ("hotpotqa", "2wikimultihopqa", "average") for m in ("ACC", "F1", "EM")]
    assert "| " + " | ".join(header) + " |" in markdown
    assert "| r3 (bm25) r3-bm25-k5 | 66.7 | 66.7 | 66.7 | 66.7 | 55.6 | 33.3 | 66.7 | 61.1 | 50.0 |" in markdown
    assert "| naive_rag (bm25) | – | 66.7 | 66.7 | – | 33.3 | 33.3 | – | 50.0 | 50.0 |" in markdown
    # Retrieval, hotpotqa at top-k 5: Recall (1 + .5 + 1)/3, Full-Recall 2/3, mAP (2/3 + 1/2 + 1)/3, docs, steps.
    assert "| r3 (bm25) r3-bm25-k5 | 83.3 | 66.7 | 72.2 | 6.7 | 2.3 | 100.0 |" in markdown
    assert "## EM vs max steps (average over datasets" in markdown
    assert "| r3 (bm25) r3-bm25-k5 | 16.7 | 33.3 | 50.0 | 50.0 | 50.0 |" in markdown

    steps = {curve["run"]: curve["points"] for curve in tables["steps_curves"]}
    assert dict(steps["r3 (bm25) r3-bm25-k5"]["hotpotqa"]) == pytest.approx(
        {1: 0, 2: 1 / 3, 3: 2 / 3, 4: 2 / 3, 5: 2 / 3}
    )
    [topk] = tables["topk_curves"]  # the two r3 runs differ only in top-k; naive RAG has no partner
    assert topk["series"] == "r3 (bm25)" and topk["runs"] == ["r3 (bm25) r3-bm25-k3", "r3 (bm25) r3-bm25-k5"]
    assert dict(topk["points"]["average"]) == pytest.approx({3: 1 / 3, 5: 1 / 2})
    assert dict(topk["points"]["hotpotqa"]) == pytest.approx({3: 1 / 3, 5: 2 / 3})


def test_judged_runs_are_plotted_by_acc(root, tmp_path):
    paths = write_report(root / "judged", tmp_path / "out")
    tables = json.loads(paths["json"].read_text())
    assert tables["metric"] == "acc" and len(tables["main"]) == 2
    steps = {curve["run"]: curve["points"]["average"] for curve in tables["steps_curves"]}
    assert dict(steps["r3 (bm25) r3-bm25-k5"]) == pytest.approx({1: 1 / 6, 2: 1 / 3, 3: 2 / 3, 4: 2 / 3, 5: 2 / 3})
    assert "## ACC vs max steps" in paths["md"].read_text() and "ACC vs top-k" in paths["html"].read_text()


def test_one_run_folder_is_a_root(root, tmp_path):
    paths = write_report(root / "judged" / "r3-bm25-k5", tmp_path / "one")
    tables = json.loads(paths["json"].read_text())
    assert [row["run"] for row in tables["main"]] == ["r3 (bm25)"] and tables["topk_curves"] == []
    assert 'id="plot-topk" class="empty"' in paths["html"].read_text()


def test_the_page_embeds_escaped_and_capped_trajectories(root, tmp_path):
    page = write_report(root, tmp_path, max_questions_per_run=2)["html"].read_text()
    assert HOSTILE not in page and "<b>x</b>" not in page and "<i>Zephyr" not in page
    assert "&lt;i&gt;" not in page  # questions are in the JSON only, never written as HTML
    assert "http://" not in page and "https://" not in page  # no CDN, font or script from the network
    items = embedded_trajectories(page)
    assert len(items) == 6 and page.count("the first 2 of 6 questions are shown (capped)") == 3
    full = embedded_trajectories(write_report(root, tmp_path)["html"].read_text())
    texts = [doc["text"] for item in full for step in item["steps"] for doc in step["docs"]]
    assert HOSTILE in texts  # the JSON round trip gives the document back unchanged


def test_no_scored_run_names_the_fix(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "run.json").write_text("{}")
    with pytest.raises(ValueError, match=r"no scored run under .*r3rag eval score --run"):
        write_report(tmp_path)
    with pytest.raises(ValueError, match="is not a folder"):
        write_report(tmp_path / "missing")


def browser_expectations(root: Path) -> tuple[list[dict], list[tuple[str, str, int, bool]]]:
    """Filter settings to try in the page, and (run, dataset, steps, correct) of every question written."""
    questions = []
    for folder, label in LABELS.items():
        verdicts = {
            row["id"]: row["correct"] for row in map(json.loads, (root / folder / "question_scores.jsonl").open())
        }
        for row in map(json.loads, (root / folder / "predictions.jsonl").open()):
            questions.append((label, row["dataset"], row["num_steps"], verdicts[row["id"]]))
    filters = [
        {"dataset": "hotpotqa", "verdict": "correct"},
        {"dataset": "2wikimultihopqa", "verdict": "wrong"},
        {"verdict": "wrong"},
        {"steps": "2"},
        {"steps": "4", "verdict": "wrong"},
        {"run": LABELS["judged/r3-bm25-k5"], "verdict": "correct"},
        {"run": LABELS["baselines/naive-bm25"], "dataset": "hotpotqa", "steps": "2"},
    ]
    return filters, questions


def expected_count(setting: dict, questions: list[tuple[str, str, int, bool]]) -> int:
    def keep(run: str, dataset: str, steps: int, correct: bool) -> bool:
        verdict = "correct" if correct else "wrong"
        return (
            setting.get("run", run) == run
            and setting.get("dataset", dataset) == dataset
            and setting.get("steps", str(steps)) == str(steps)
            and setting.get("verdict", verdict) == verdict
        )

    return sum(keep(*question) for question in questions)


def test_the_page_in_headless_chromium(root, tmp_path):
    if not CHROMIUM.exists() or not PLAYWRIGHT.exists() or not shutil.which("node"):
        pytest.skip("Chromium, Node.js or playwright-core is missing: run `bash scripts/setup_browser.sh`")
    paths = write_report(root, tmp_path / "report")
    filters, questions = browser_expectations(root)
    k5 = LABELS["judged/r3-bm25-k5"]
    plan = {
        "filters": filters,
        "gold": {"run": k5, "question": "director of Blue Harbour"},
        "hostile": {"run": k5, "question": "Ann Lee and Bo Chan"},
        "stepsView": "hotpotqa",
        "screenshot": str(tmp_path / "page.png"),
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    result = subprocess.run(
        ["node", str(ROOT / "tests" / "browser" / "check_report.mjs"), str(paths["html"]), str(tmp_path / "seen.json"),
         str(tmp_path / "plan.json")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "CHROMIUM": str(CHROMIUM)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["errors"] == [] and seen["requests"] and all(url.startswith("file://") for url in seen["requests"])

    assert seen["mainRows"] == 3 and seen["retrievalRows"] == 3
    assert seen["mainCells"][LABELS["baselines/naive-bm25"]][:3] == ["–", "66.7", "66.7"]
    assert seen["stepsLines"] == 3 and seen["stepsDots"] == 15 and seen["topkLines"] == 1 and seen["topkDots"] == 2
    assert seen["stepsViewLines"] == 3 and seen["stepsViewShown"] == "hotpotqa"
    assert seen["legend"] == [LABELS[folder] for folder in sorted(RUNS)]

    total = len(questions)
    assert seen["trajectories"] == total == 18 and seen["countText"] == f"{total} of {total} shown"
    for got in seen["filtered"]:
        assert got["visible"] == expected_count(got["setting"], questions), got
        assert got["countText"] == f"{got['visible']} of {total} shown"
    assert {got["visible"] for got in seen["filtered"]} != {0}

    gold = seen["gold"]  # h1 at top-k 5: two queries, each finding one of its two gold passages
    assert gold["queries"] == ["h1 query 0", "h1 query 1"] and gold["goldDocs"] == 2 and gold["docs"] == 10
    assert gold["goldMarks"] == ["★ gold", "★ gold"] and gold["goldVisible"]
    assert gold["facts"]["Golden answers"] == "Paris" and gold["facts"]["Verdict"] == "correct"
    assert gold["facts"]["EM / F1"] == "100.0 / 100.0" and gold["facts"]["Judge"] == "match, score 1.00"
    assert gold["textBefore"] < 320 < gold["textAfter"] == len(LONG_TEXT.strip())  # "more" shows all of it

    hostile = seen["hostile"]
    assert HOSTILE in hostile["docTexts"] and hostile["facts"]["Verdict"] == "wrong"
    assert seen["injected"] == 0  # no <b> or <i> element came from a question, a document or an output
    assert Path(plan["screenshot"]).stat().st_size > 20_000
