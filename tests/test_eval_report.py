"""The report over hand-made scored runs: tables and curves from the scores, and the page in headless Chromium.

Four runs over two datasets (r3 with BM25 at top-k 5 and 3, judged; naive RAG and direct CoT, which
retrieves nothing and lacks one question, not judged) and one unscored run. Their predictions are
written here; scores.json and question_scores.jsonl come from ``eval.score.score_rows`` over them,
so the files are what ``r3rag eval score`` writes. The expected numbers below are worked out by
hand from the outcomes in ``RUNS``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

from eval.report import find_runs, write_report
from eval.report_categories import pair_runs
from eval.report_training import stage_switch, training_charts, training_html, training_markdown
from eval.score import format_scores, score_rows
from r3_env.cli import main
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
    "baselines/direct": ("direct", 5, {  # no w3: a question only the runs with retrieval have
        "h1": (0, "wrong"), "h2": (0, "right"), "h3": (0, "right"),
        "w1": (0, "right"), "w2": (0, "wrong"),
    }),
}  # fmt: skip
LABELS = {
    "judged/r3-bm25-k5": "r3 (bm25) r3-bm25-k5",
    "judged/r3-bm25-k3": "r3 (bm25) r3-bm25-k3",
    "baselines/naive-bm25": "naive_rag (bm25)",
    "baselines/direct": "direct (none)",
}
CATEGORY_KEYS = ("both", "retrieval_only", "no_retrieval_only", "neither", "compared", "excluded")
# Each run with retrieval against direct CoT, correct by EM (naive RAG was not judged), by hand from RUNS. In hotpotqa
# for r3 at top-k 5: h1 right only with retrieval, h2 only without, h3 in both. w3 is not in the direct run: left out.
CATEGORIES = {
    (LABELS["baselines/naive-bm25"], "hotpotqa"): (2, 0, 0, 1, 3, 0),
    (LABELS["judged/r3-bm25-k3"], "hotpotqa"): (0, 1, 2, 0, 3, 0),
    (LABELS["judged/r3-bm25-k5"], "hotpotqa"): (1, 1, 1, 0, 3, 0),
    **{(LABELS[folder], "2wikimultihopqa"): (0, 0, 1, 1, 2, 1) for folder in RUNS if folder != "baselines/direct"},
}
LONG_TEXT = "The director was born in Paris. " * 20  # longer than the page's 300-character preview


def manifest(folder: str, method: str, topk: int) -> dict:
    return {
        "name": folder.split("/")[-1],
        "method": method,
        "retriever": "none" if method == "direct" else "bm25",
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


def save_run(run: Path, info: dict, rows: list[dict], verdicts: dict | None, scored: bool = True) -> None:
    """The files `r3rag eval run` and then (if ``scored``) `r3rag eval score` leave; ``verdicts`` None: no judge."""
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps(info))
    write_jsonl(run / "predictions.jsonl", rows)
    if not scored:
        return
    body, per_question = score_rows(rows, CUTOFFS, verdicts, retrieves=info["retriever"] != "none")
    judge = "Qwen/Qwen2.5-72B-Instruct" if verdicts is not None else None
    (run / "scores.json").write_text(json.dumps({"run": info, "judge": judge, **body}))
    write_jsonl(run / "question_scores.jsonl", per_question)


def write_run(root: Path, folder: str, spec: tuple, scored: bool = True) -> None:
    """A run folder of ``RUNS``; r3 runs are judged."""
    method, topk, plan = spec
    rows = [
        prediction(method, name, q, *plan[q[0]], topk) for name, qs in QUESTIONS.items() for q in qs if q[0] in plan
    ]
    if folder.endswith("k5"):  # a document that would end the page's <script> if it were not escaped
        rows[1]["steps"][0]["documents"][-1]["contents"] = f"Hostile page\n{HOSTILE}"
    judged = method == "r3"
    verdicts = {row["id"]: verdict(plan[row["question_id"]][1]) for row in rows if row["answer"]} if judged else None
    save_run(root / folder, manifest(folder, method, topk), rows, verdicts, scored)


@pytest.fixture
def root(tmp_path) -> Path:
    """The four scored runs and an unscored copy of the naive one, under tmp_path/runs."""
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
            assert row["scores"][name] == {key: final[key] for key in ("acc", "f1", "em", "avg_retrievals")}
        assert row["scores"]["average"]["em"] == scores["average"]["final"]["em"]
    k5 = next(row for row in tables["main"] if row["name"] == "r3-bm25-k5")
    assert k5["scores"]["2wikimultihopqa"] == pytest.approx(
        {"acc": 2 / 3, "f1": 5 / 9, "em": 1 / 3, "avg_retrievals": 5 / 3}
    )

    markdown = paths["md"].read_text()
    groups = ("hotpotqa", "2wikimultihopqa", "average")
    header = ["run"] + [f"{d} {m}" for d in groups for m in ("ACC", "F1", "EM", "RC")]
    assert "| " + " | ".join(header) + " |" in markdown
    # RC: queries per question, (2 + 1 + 1) / 3 and (2 + 3 + 0) / 3 (the unparsed w2 had asked 3), then their mean
    assert (
        "| r3 (bm25) r3-bm25-k5 | 66.7 | 66.7 | 66.7 | 1.33 | 66.7 | 55.6 | 33.3 | 1.67 | 66.7 | 61.1 | 50.0 | 1.50 |"
        in markdown
    )
    assert "| naive_rag (bm25) | – | 66.7 | 66.7 | 1.00 | – | 33.3 | 33.3 | 1.00 | – | 50.0 | 50.0 | 1.00 |" in markdown
    assert "| direct (none) | – | 66.7 | 66.7 | 0.00 | – | 50.0 | 50.0 | 0.00 | – | 58.3 | 58.3 | 0.00 |" in markdown
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

    categories = tables["categories"]
    assert categories["metric"] == "em" and {pair["baseline"] for pair in categories["pairs"]} == {"direct (none)"}
    got = {
        (pair["run"], name): tuple(counts[key] for key in CATEGORY_KEYS)
        for pair in categories["pairs"]
        for name, counts in pair["datasets"].items()
    }
    assert got == CATEGORIES
    assert categories["notes"] == ["3 question(s) in only one run of their pair are left out (column 'left out')"]
    assert "## Answer categories (questions; correct: EM, as not every run was judged)" in markdown
    assert "| hotpotqa | r3 (bm25) r3-bm25-k3 | direct (none) | 0 | 1 | 2 | 0 | 3 | 0 |" in markdown

    printed = format_scores(json.loads((root / "judged" / "r3-bm25-k5" / "scores.json").read_text()))
    assert printed.splitlines()[1].split()[:6] == ["dataset", "n", "ACC", "EM", "F1", "RC"]
    assert printed.splitlines()[-2].split()[:5] == ["average", "66.7", "50.0", "61.1", "1.50"]


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
    assert len(items) == 8 and page.count("the first 2 of 6 questions are shown (capped)") == 3
    assert page.count("the first 2 of 5 questions are shown (capped)") == 1  # direct CoT lacks w3
    full = embedded_trajectories(write_report(root, tmp_path)["html"].read_text())
    texts = [doc["text"] for item in full for step in item["steps"] for doc in step["docs"]]
    assert HOSTILE in texts  # the JSON round trip gives the document back unchanged


# Questions per dataset, one letter each: correct in Both runs, only with Retrieval, only with No retrieval, Wrong
# in both; r and n: a question only the run with (r) or without (n) retrieval has.
CATEGORY_PLAN = {"nq": "BRNWBRBNRBr", "popqa": "NWBNWnN"}


def write_category_run(root: Path, folder: str, model: str, queries: int, retriever: str = "bm25", judged=True) -> None:
    """A scored run over CATEGORY_PLAN; ``queries`` 0 plays the run without retrieval. Answers are right as the
    letters say, but never exactly ("Paris indeed"): only the judge accepts them, EM never does."""
    rows, verdicts = [], {}
    for dataset, letters in CATEGORY_PLAN.items():
        for i, letter in enumerate(letters):
            if letter == ("n" if queries else "r"):
                continue
            right = letter in ("BR" if queries else "BN")
            answer = "Paris indeed" if right else "Nobody"
            steps = [{"query": f"q{j}", "documents": []} for j in range(queries)] + [{"answer": answer}]
            rows.append({"id": f"{dataset}/{i}", "question_id": str(i), "dataset": dataset, "question": f"Q{i}?",
                         "golden_answers": ["Paris"], "gold_ids": [], "steps": steps, "answer": answer,
                         "prediction": answer, "num_steps": len(steps), "num_retrievals": queries})  # fmt: skip
            verdicts[rows[-1]["id"]] = {"score": float(right), "method": "judge", "fallback": False}
    info = {"name": folder.replace("/", "-"), "method": "r3" if retriever != "none" else "direct",
            "retriever": retriever, "model": model, "env": {"max_steps": 5, "topk": 5}}  # fmt: skip
    save_run(root / folder, info, rows, verdicts if judged else None)


@pytest.mark.parametrize("judged", [True, False])
def test_answer_categories_count_each_case(tmp_path, judged):
    root = tmp_path / "runs"
    write_category_run(root, "with", "A", queries=2, judged=judged)
    write_category_run(root, "without", "A", queries=0, retriever="none", judged=judged)
    paths = write_report(root)
    categories = json.loads(paths["json"].read_text())["categories"]
    [pair] = categories["pairs"]
    assert (pair["run"], pair["baseline"]) == ("r3 (bm25)", "direct (none)")
    if judged:  # correct = ACC: the letters' counts
        assert categories["metric"] == "acc"
        assert pair["datasets"] == {
            "nq": {"both": 4, "retrieval_only": 3, "no_retrieval_only": 2, "neither": 1, "compared": 10, "excluded": 1},
            "popqa": {
                "both": 1,
                "retrieval_only": 0,
                "no_retrieval_only": 3,
                "neither": 2,
                "compared": 6,
                "excluded": 1,
            },
        }
        assert "| nq | r3 (bm25) | direct (none) | 4 | 3 | 2 | 1 | 10 | 1 |" in paths["md"].read_text()
        assert "Correct: ACC, the judge&#x27;s verdict." in paths["html"].read_text()
    else:  # correct = EM, which no answer here meets: every question compared is wrong in both
        assert categories["metric"] == "em"
        assert [counts["neither"] for counts in pair["datasets"].values()] == [10, 6]
        assert [counts["both"] + counts["retrieval_only"] for counts in pair["datasets"].values()] == [0, 0]
    assert categories["notes"] == ["2 question(s) in only one run of their pair are left out (column 'left out')"]


def test_runs_pair_by_model_or_as_named(tmp_path, capsys):
    root = tmp_path / "runs"
    write_category_run(root, "a/r3", "A", queries=1)
    write_category_run(root, "a/direct", "A", queries=0, retriever="none")
    write_category_run(root, "b/r3", "B", queries=2)

    def pairs(*baselines: str) -> tuple[list[tuple[str, str]], list[str]]:
        found, notes = pair_runs(find_runs(root), root, baselines)
        return [(run.info["name"], base.info["name"]) for run, base in found], notes

    assert pairs() == (
        [("a-r3", "a-direct")],
        ["r3 (bm25) b-r3: no run without retrieval of its model over its datasets"],
    )
    assert pairs("a/direct") == ([("a-r3", "a-direct"), ("b-r3", "a-direct")], [])  # named: across models too
    write_category_run(root, "a/silent", "A", queries=0)  # its method retrieves, but it never did: RC 0
    assert pairs()[0] == [("a-r3", "a-direct"), ("a-silent", "a-direct")]
    write_category_run(root, "a/direct2", "A", queries=0, retriever="none")
    found, notes = pairs()
    assert found == [] and notes[0] == (
        "r3 (bm25) a-r3: several runs without retrieval could pair with it (direct (none) a-direct, "
        "direct (none) a-direct2); "
        "pick with --baseline"
    )
    assert pairs("direct (none) a-direct2")[0] == [
        ("a-r3", "a-direct2"),
        ("a-silent", "a-direct2"),
        ("b-r3", "a-direct2"),
    ]

    out = tmp_path / "report"
    assert main(["eval", "report", str(root), "--out", str(out), "--baseline", "a/direct"]) == 0
    categories = json.loads((out / "report.json").read_text())["categories"]
    assert [(pair["run"], pair["baseline"]) for pair in categories["pairs"]] == [
        ("r3 (bm25) a-r3", "direct (none) a-direct"),
        ("r3 (bm25) a-silent", "direct (none) a-direct"),
        ("r3 (bm25) b-r3", "direct (none) a-direct"),
    ]
    assert main(["eval", "report", str(root), "--out", str(out), "--baseline", "nowhere"]) == 2
    assert "--baseline 'nowhere' matches no scored run" in capsys.readouterr().err


RC_CURVE = [1.0, 1.5, 2.25, 1.75, 1.25, 1.0]  # retrievals per episode: up in stage 1, down in stage 2


def write_training(folder: Path, scheme: str = "lws", options: dict | None = None) -> Path:
    """A `r3rag train local` folder: config.json's reward (switch at step 3) and six PPO iterations' metrics."""
    folder.mkdir(parents=True)
    reward = {"scheme": scheme, "options": {"switch_step": 3} if options is None else options}
    (folder / "config.json").write_text(json.dumps({"reward": reward}))
    rows = [{"stage": "ppo", "step": step, "reward": step / 10, "retrievals": rc, "steps": rc + 1}
            for step, rc in enumerate(RC_CURVE, start=1)]  # fmt: skip
    write_jsonl(folder / "metrics.jsonl", rows)
    return folder


def test_training_curves_show_what_searching_paid(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    first = {"searched": 0.5, "found_gold": 0.25, "reward_searched": 1.0, "reward_not_searched": 0.0}
    second = {"searched": 0.0, "found_gold": 0.0, "reward_not_searched": 0.5}  # no episode searched
    rows = [{"stage": "ppo", "step": step, "reward": 0.5, **values} for step, values in ((1, first), (2, second))]
    write_jsonl(folder / "metrics.jsonl", rows)
    charts = {chart["title"]: chart for chart in training_charts(folder)}
    shares = charts["Episodes that searched, and whose searches found a gold passage their start lacked"]
    assert shares["percent"] and shares["series"] == {
        "searched": [[1, 0.5], [2, 0.0]],
        "found gold": [[1, 0.25], [2, 0.0]],
    }
    paid = charts["Mean reward of the episodes that searched and of those that did not"]
    # the iteration where no episode searched has no point for them, rather than a 0
    assert paid["series"] == {"searched": [[1, 1.0]], "did not search": [[1, 0.0], [2, 0.5]]}


def test_the_report_charts_sft_then_an_rl_run_of_its_own(root, tmp_path):
    """The real-question demo trains RL in a run of its own from the SFT policy: the page charts both runs."""
    sft = tmp_path / "train"
    sft.mkdir()
    (sft / "config.json").write_text(json.dumps({"reward": {"scheme": "r3", "options": {}}}))
    write_jsonl(sft / "metrics.jsonl", [{"stage": "sft", "step": step, "loss": 2.0 / step} for step in (1, 2)])
    rl = write_training(tmp_path / "rl", "r3", {})
    tables = json.loads(write_report(root, tmp_path / "report", training=[sft, rl])["json"].read_text())
    titles = [chart["title"] for chart in tables["training"]]
    assert titles[0] == "SFT loss" and "Mean episode reward" in titles[1:]
    assert tables["training"][0]["series"] == {"loss": [[1, 2.0], [2, 1.0]]}


def test_training_curves_show_rc_and_the_stage_switch(tmp_path):
    charts = training_charts(write_training(tmp_path / "lws"))
    rc = next(chart for chart in charts if chart["title"] == "Retrievals per episode (RC)")
    assert rc["y_label"] == "RC" and rc["series"] == {"RC": [[i, v] for i, v in enumerate(RC_CURVE, start=1)]}
    # iteration 3 is stage 1's last (its rollouts ran at training step 2): the marker stands before iteration 4, on
    # the reward and steps charts and on RC's, which is charted once, in the Health group (its drift sign's warnings)
    assert [chart["markers"] for chart in charts] == [[{"x": 3.5, "label": "stage 2", "first": 4}]] * 3
    assert [(chart["title"], chart["group"]) for chart in charts] == [
        ("Mean episode reward", "training"),
        ("Steps and documents per episode", "training"),
        ("Retrievals per episode (RC)", "health"),
    ]
    page = training_html(charts)
    assert page.count('class="marker"') == 3 and "stage 2 of the reward starts at PPO iteration 4" in page
    markdown = training_markdown(charts)
    assert "| Retrievals per episode (RC) | RC | 1 | 1 |" in markdown
    assert (
        markdown[-1] == "Stage 2 of the reward starts at PPO iteration 4 (RC 2.25 at iteration 3, the last of stage 1)."
    )

    assert all(chart["markers"] == [] for chart in training_charts(write_training(tmp_path / "r3", "r3", {})))
    assert stage_switch(write_training(tmp_path / "no-stage-1", options={"switch_step": 0})) is None
    assert stage_switch(write_training(tmp_path / "unknown", "no_such_scheme", {})) is None
    default = training_charts(write_training(tmp_path / "default", "lws", {}))  # the scheme's own switch step
    switch = stage_switch(tmp_path / "default")
    assert isinstance(switch, int) and default[0]["markers"][0]["first"] == switch + 1
    if switch >= len(RC_CURVE):  # past the logged iterations: no line, and the text says so
        assert 'class="marker"' not in training_html(default) and training_markdown(default)[-1].endswith(
            "(not reached)."
        )


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
    paths = write_report(root, tmp_path / "report", training=write_training(tmp_path / "train"))
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

    assert seen["mainRows"] == 4 and seen["retrievalRows"] == 3 and seen["mainColumns"] == ["ACC", "F1", "EM", "RC"] * 3
    assert seen["mainCells"][LABELS["baselines/naive-bm25"]][:4] == ["–", "66.7", "66.7", "1.00"]
    assert seen["mainCells"]["direct (none)"][-1] == "0.00"  # RC of the run without retrieval
    assert seen["stepsLines"] == 4 and seen["stepsDots"] == 20 and seen["topkLines"] == 1 and seen["topkDots"] == 2
    assert seen["stepsViewLines"] == 4 and seen["stepsViewShown"] == "hotpotqa"
    assert seen["legend"] == [LABELS[folder] for folder in sorted(RUNS)]

    # answer categories: one bar per (run with retrieval, dataset), each segment as wide as its share of the questions
    bars = {(bar["run"], bar["dataset"]): bar["segments"] for bar in seen["categoryBars"]}
    assert bars.keys() == CATEGORIES.keys()
    for key, segments in bars.items():
        *counts, compared, _ = CATEGORIES[key]
        assert [name for name, _ in segments] == list(CATEGORY_KEYS[:4])
        full = sum(width for _, width in segments)
        assert full > 250, key  # drawn, at most of the 600-pixel chart's width
        assert [width for _, width in segments] == pytest.approx([full * n / compared for n in counts], abs=0.5), key
    assert "Correct: EM" in seen["categoryCaption"]
    assert seen["categoryLegend"][:2] == ["correct in both", "correct only with retrieval"]
    k3 = LABELS["judged/r3-bm25-k3"]
    assert len(seen["categoryRows"]) == 6
    assert ["hotpotqa", k3, "direct (none)", "0", "1", "2", "0", "3", "0"] in seen["categoryRows"]

    # training and health: RC per PPO iteration with the stage switch between iterations 3 and 4
    rc = next(figure for figure in seen["training"] if figure["caption"] == "Retrievals per episode (RC)")
    assert "stage 2 of the reward starts at PPO iteration 4" in seen["stageSwitch"] and len(rc["dots"]) == len(RC_CURVE)
    [marker] = rc["markers"]
    assert rc["dots"][2] < marker < rc["dots"][3]
    assert [len(figure["markers"]) for figure in seen["training"]] == [1, 1, 1]

    total = len(questions)
    assert seen["trajectories"] == total == 23 and seen["countText"] == f"{total} of {total} shown"
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


# -- R2AG's retrieval table: the tree (rrt) beside single-shot retrieval ---------------------------------------

# hotpotqa's questions as the tree found them: per retrieval (iteration, documents), the iterations, the reader's
# outcome and the seconds (retrieval, generation). h1: 3 documents over 2 levels (a third iteration stopped).
TREE_ROWS = {
    "h1": ([(1, ["h1-g0"]), (1, ["x1"]), (2, ["h1-g1"])], 3, "right", 0.2, 1.0),
    "h2": ([(1, ["h2-g0", "y"])], 1, "wrong", 0.1, 0.5),
    "h3": ([(1, ["z"]), (2, ["h3-g0"])], 2, "right", 0.3, 1.5),
}
SHOT_DOCS = {"h1": ["h1-g0", "d"], "h2": ["d", "h2-g1"], "h3": ["h3-g0", "d"]}  # top-2 with the question


def retrieval_row(method: str, question: tuple, retrievals, iterations, outcome, retrieval_s, generation_s) -> dict:
    from r3_env.retrieval.metrics import retrieval_quality

    qid, text, golden, gold = question
    steps = [
        {
            "analysis": "",
            "query": f"{qid} q{i}",
            "depth": depth,
            "documents": [{"id": d, "contents": f"{d}\nx"} for d in docs],
        }
        for i, (depth, docs) in enumerate(retrievals)
    ]
    ranked = list(dict.fromkeys(d for _, docs in retrievals for d in docs))
    answer = None if outcome is None else (golden[0] if outcome == "right" else "Nobody")
    if answer is not None:
        steps.append({"analysis": "From the documents.", "answer": answer})
    retrieval = {
        **retrieval_quality(ranked, gold),
        "num_docs": float(len(ranked)),
        "iterations": float(iterations),
        "generation_s": generation_s,
        "retrieval_s": retrieval_s,
        "wall_s": retrieval_s + generation_s,
    }
    return {
        "id": f"hotpotqa/{qid}",
        "question_id": qid,
        "dataset": "hotpotqa",
        "method": method,
        "question": text,
        "golden_answers": golden,
        "gold_ids": gold,
        "steps": steps,
        "answer": answer,
        "prediction": answer or "",
        "num_steps": iterations,
        "num_retrievals": len(retrievals),
        "num_docs": len(ranked),
        "retrieval": retrieval,
        "time_s": 1.0,
    }


def test_the_retrieval_tree_table_sets_the_tree_beside_single_shot(root):
    questions = {q[0]: q for q in QUESTIONS["hotpotqa"]}
    tree_rows = [retrieval_row("rrt", questions[qid], *spec) for qid, spec in TREE_ROWS.items()]
    tree_info = {
        **manifest("trees/rrt", "rrt", 5),
        "datasets": ["hotpotqa"],
        "step_format": "multi_query",
        "tree": {"topk": 1, "max_iterations": 5},
    }
    save_run(root / "trees" / "rrt", tree_info, tree_rows, None)
    shot_rows = [
        retrieval_row("single_shot", questions[q], [(1, docs)], 1, None, 0.05, 0.0) for q, docs in SHOT_DOCS.items()
    ]
    shot_info = {
        **manifest("trees/single-k2", "single_shot", 5),
        "naive_topk": 2,
        "answers": False,
        "model": "none",
        "datasets": ["hotpotqa"],
    }
    save_run(root / "trees" / "single-k2", shot_info, shot_rows, None)

    paths = write_report(root)
    tables = json.loads(paths["json"].read_text())
    tree_table = {row["run"]: row for row in tables["tree_retrieval"]}
    assert list(tree_table) == ["rrt (bm25)", "single_shot (bm25)"] and tables["tree_notes"] == []  # @K 2.3 -> k 2
    # by hand: Recall (1 + .5 + 1)/3, Full-Recall 2/3, AP h1 (1 + 2/3)/2, h2 (1/1)/2, h3 (1/2)/1, @K 7/3
    assert tree_table["rrt (bm25)"]["scores"]["hotpotqa"] == pytest.approx(
        {
            "recall": 5 / 6,
            "full_recall": 2 / 3,
            "map": (5 / 6 + 0.5 + 0.5) / 3,
            "avg_docs": 7 / 3,
            "iterations": 2.0,
            "retrieval_s": 0.2,
            "generation_s": 1.0,
        }
    )
    # single-shot at top-2: AP h1 (1/1)/2, h2 (1/2)/2, h3 1
    assert tree_table["single_shot (bm25)"]["scores"]["hotpotqa"] == pytest.approx(
        {
            "recall": 2 / 3,
            "full_recall": 1 / 3,
            "map": (0.5 + 0.25 + 1) / 3,
            "avg_docs": 2.0,
            "iterations": 1.0,
            "retrieval_s": 0.05,
            "generation_s": 0.0,
        }
    )
    markdown = paths["md"].read_text()
    assert "| rrt (bm25) | 83.3 | 66.7 | 61.1 | 2.3 | 2.00 | 0.200 | 1.000 | – | – | – | – | – | – | – |" in markdown
    assert "| single_shot (bm25) | 66.7 | 33.3 | 58.3 | 2.0 | 1.00 | 0.050 | 0.000 |" in markdown
    # the tree answers (main table, curves, categories); single-shot retrieval answers nothing and is in none of them
    assert [row["run"] for row in tables["main"]] == [*(LABELS[f] for f in sorted(RUNS)), "rrt (bm25)"]
    assert "single_shot (bm25)" not in {curve["run"] for curve in tables["steps_curves"]}
    assert {pair["run"] for pair in tables["categories"]["pairs"]} == {*CATEGORIES_RUNS, "rrt (bm25)"}
    assert len(tables["retrieval"]) == 3  # the step-by-step runs' retrieval table is as before
    summary = {run["run"]: run for run in tables["runs"]}
    assert summary["rrt (bm25)"]["max_steps"] == 5 and summary["single_shot (bm25)"]["model"] == "none"
    # by iteration: at cutoff 1 the tree had read h1-g0 and x1, h2-g0 and y, and z; the answers came later
    by_one = json.loads((root / "trees" / "rrt" / "scores.json").read_text())["datasets"]["hotpotqa"]["by_cutoff"]["1"]
    assert by_one["recall"] == pytest.approx(1 / 3) and by_one["avg_docs"] == pytest.approx(5 / 3)
    assert by_one["em"] == 0.0 and by_one["answered"] == pytest.approx(1 / 3)  # h2 stopped after one iteration
    page = paths["html"].read_text()
    assert 'id="tree-retrieval-table"' in page and "Retrieval tree vs single-shot (R2AG)" in page

    (root / "trees" / "single-k2" / "scores.json").unlink()  # without it, the report names the run to make
    tables = json.loads(write_report(root)["json"].read_text())
    assert tables["tree_notes"] == [
        "rrt (bm25): no single-shot run on hotpotqa at its @K 2.3; "
        "r3rag eval run --method single_shot --naive_topk 2 (over hotpotqa)"
    ]


CATEGORIES_RUNS = {LABELS[f] for f in RUNS if f != "baselines/direct"}


LEARNED = ("naive-bm25", "r3-bm25-k3", "r3-bm25-k5")  # run names, in the order a policy would go through them


def test_the_page_opens_with_one_question_answered_by_each_policy(root, tmp_path):
    paths = write_report(root, tmp_path / "report", learned=LEARNED)
    example = json.loads(paths["json"].read_text())["learned"]
    # k5 is right where naive RAG is wrong on h1 and w1; both find two gold pages; h1 comes first in the file
    assert example["question"] == "Where was the director of Blue Harbour born?"
    assert [c["run"] for c in example["columns"]] == list(LEARNED)
    assert [c["correct"] for c in example["columns"]] == [False, True, True]
    page = paths["html"].read_text()
    assert page.index('<section id="learned">') < page.index("<h2>Runs</h2>")
    assert page.count('<span class="gold-mark">★ gold</span>') == 1 + 2 + 2  # naive's one query, two each for r3
    markdown = paths["md"].read_text()
    assert markdown.index("## What was learned") < markdown.index("## Answers")
    assert "- **r3-bm25-k5** (correct):" in markdown and "h1 query 1 -> Gold page 1 (gold)" in markdown
    # without names, or with fewer than two of them present, there is no panel
    assert "learned" not in json.loads(write_report(root, tmp_path / "plain")["json"].read_text())
    one = write_report(root, tmp_path / "one", learned=("naive-bm25", "absent"))
    assert 'id="learned"' not in one["html"].read_text()


def test_the_learned_panel_renders_first_in_headless_chromium(root, tmp_path):
    if not CHROMIUM.exists():
        pytest.skip("Chromium is missing: run `bash scripts/setup_browser.sh`")
    paths = write_report(root, tmp_path / "report", learned=LEARNED)
    shot = tmp_path / "learned.png"
    common = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"]
    dom = subprocess.run(
        [*common, "--dump-dom", paths["html"].as_uri()], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    subprocess.run([*common, f"--screenshot={shot}", paths["html"].as_uri()], capture_output=True, timeout=120)
    headings = re.findall(r"<h2[^>]*>(.*?)</h2>", dom)
    assert headings[0] == "What was learned", headings[:3]
    assert dom.count('class="learned-column"') == 3 and "Where was the director of Blue Harbour born?" in dom
    assert shot.exists() and shot.stat().st_size > 10_000


def test_an_episode_that_searched_the_question_first_shows_that_search_and_old_runs_read_at_the_defaults(tmp_path):
    """env.question_docs: the browser's first step is the environment's search, its gold marked; a run recorded
    before the rule existed reads as run at its default."""
    from eval.report import QUESTION_SEARCH, Run, _steps

    row = {"question": "Q?", "gold_ids": ["g"], "question_documents": [{"id": "g", "contents": "Title\nText"}],
           "steps": [{"analysis": "It says so.", "answer": "A"}]}  # fmt: skip
    first, last = _steps(row)
    assert (first["analysis"], first["query"], first["docs"][0]["gold"]) == (QUESTION_SEARCH, "Q?", True)
    assert last["answer"] == "A" and len(_steps({**row, "question_documents": []})) == 1
    old = Run(tmp_path, {"run": {"env": {"max_steps": 5, "topk": 5}}})
    assert old.env["question_docs"] == 0 and old.topk == 5 and Run(tmp_path, {"run": {}}).env == {}
