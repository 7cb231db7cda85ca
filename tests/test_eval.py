"""The evaluation harness: metrics on hand-checked examples, run + score end to end, resume after a kill, the judge.

Runs use a real tiny transformer (HFEngine) and a real BM25 index over a generated world. The
tiny model's weights are random, so HFEngine's constrained decoding writes the planned steps
(every forward pass still runs); free generation is used where its junk is what is tested.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, Script, ServiceProcess, answer_step, query_step, run_r3rag, scripted_engine

from eval.engines import EngineConfig, GenerationConfig
from eval.metrics import aggregate, answer_scores, average, question_metrics, retrieval_scores
from eval.run import EvalRunConfig, run_eval
from eval.score import ScoreConfig, score_run
from r3_env.data import iter_jsonl
from r3_env.env import EnvConfig
from r3_env.protocol.base import OUT_OF_SEARCHES
from r3_env.runs import JudgeClientConfig, RetrievalSource

# -- metrics on hand-checked examples -----------------------------------------------------------------


def test_answer_scores_follow_flashrag():
    assert answer_scores("The Eiffel Tower.", ["eiffel tower"]) == {"em": 1.0, "f1": 1.0, "sub_em": 1.0}
    scores = answer_scores("Paris, France", ["Paris"])  # tokens: paris france / paris
    assert scores["em"] == 0.0 and scores["sub_em"] == 1.0 and scores["f1"] == pytest.approx(2 / 3)
    assert answer_scores("", ["Paris"]) == {"em": 0.0, "f1": 0.0, "sub_em": 0.0}
    assert answer_scores("no", ["not known"])["f1"] == 0.0  # yes/no/noanswer only match themselves


def test_retrieval_scores_by_hand():
    # gold a, b found at ranks 1 and 3: AP = (1/1 + 2/3) / 2
    assert retrieval_scores(["a", "x", "b"], ["a", "b"]) == pytest.approx(
        {"recall": 1.0, "full_recall": 1.0, "ap": (1 + 2 / 3) / 2}
    )
    # only b found, at rank 2: AP = (1/2) / 2
    assert retrieval_scores(["x", "b", "y"], ["a", "b"]) == pytest.approx(
        {"recall": 0.5, "full_recall": 0.0, "ap": 0.25}
    )
    assert retrieval_scores(["x"], []) is None


def _row(num_steps: int, answer: str | None, docs_per_step: list[list[str]], gold=("g1", "g2")) -> dict:
    steps = [
        {"analysis": "a", "query": "q", "documents": [{"id": d, "contents": d} for d in ids]} for ids in docs_per_step
    ]
    if answer is not None:
        steps.append({"analysis": "a", "answer": answer})
    return {"id": "d/1", "dataset": "d", "golden_answers": ["Paris"], "gold_ids": list(gold), "answer": answer,
            "prediction": answer or "", "steps": steps, "num_steps": num_steps}  # fmt: skip


def test_step_cutoffs_drop_late_answers_and_unread_documents():
    row = _row(3, "Paris", [["g1", "x"], ["y", "g2"]])  # answers at step 3 after two retrievals
    late = question_metrics(row, 2, verdict=1.0)
    assert late["answered"] == 0.0 and late["em"] == 0.0 and late["acc"] == 0.0  # no answer within 2 steps
    # with max_steps 2 the second query ends the episode: its documents are never read
    assert late["retrieval"] == pytest.approx({"recall": 0.5, "full_recall": 0.0, "ap": (1 / 1) / 2})
    assert late["steps"] == 2 and late["retrievals"] == 2 and late["docs"] == 2
    first = question_metrics(row, 1, verdict=1.0)
    assert first["retrieval"] == {"recall": 0.0, "full_recall": 0.0, "ap": 0.0} and first["docs"] == 0
    full = question_metrics(row, 5, verdict=1.0)
    assert full["answered"] == 1.0 and full["em"] == 1.0 and full["acc"] == 1.0 and full["steps"] == 3
    assert full["retrieval"] == pytest.approx({"recall": 1.0, "full_recall": 1.0, "ap": (1 / 1 + 2 / 4) / 2})
    assert full["docs"] == 4
    unjudged = question_metrics(row, 5, verdict=None)
    assert unjudged["acc"] is None
    endless = _row(2, None, [["g1"], ["g2"]])  # ran out of steps at the second query
    assert question_metrics(endless, 5, verdict=None)["retrieval"]["recall"] == 0.5


def test_aggregate_and_average():
    right = question_metrics(_row(2, "Paris", [["g1", "g2"]]), 5, verdict=1.0)
    wrong = question_metrics(_row(2, "Rome", [["x"]], gold=()), 5, verdict=0.0)
    cell = aggregate([right, wrong])
    assert cell["acc"] == 0.5 and cell["em"] == 0.5 and cell["avg_docs"] == 1.5 and cell["avg_steps"] == 2.0
    assert cell["recall"] == 1.0 and cell["gold_questions"] == 1  # only the question with gold counts
    half_judged = aggregate([right, question_metrics(_row(2, "Rome", [["x"]]), 5, verdict=None)])
    assert half_judged["acc"] is None  # ACC is all or nothing: a partial judge must not look like a full one
    both = average([cell, {**cell, "acc": 1.0, "recall": None}])
    assert both["acc"] == 0.75 and both["recall"] is None and both["gold_questions"] == 2


# -- run and score end to end ---------------------------------------------------------------------------


def test_run_and_score_a_scripted_policy(eval_world, eval_tiny, tmp_path):
    """Three questions with known trajectories: metrics per cutoff are checked against hand counts."""
    right, wrong, endless = eval_world["items"][:3]
    plans = {
        right.question: [query_step("first", "q one"), query_step("second", "q two"),
                         answer_step("done", right.golden_answers[0])],
        wrong.question: [query_step("look", "river town"), answer_step("guess", "Nobody In Particular")],
        endless.question: [query_step("again", "more")],  # searches until max_steps: no answer
    }  # fmt: skip
    out = tmp_path / "run"
    config = EvalRunConfig(data=str(eval_world["dev"]), out=str(out), max_questions=3, concurrency=3)
    engine_config = EngineConfig(model=str(eval_tiny))
    stats = asyncio.run(
        run_eval(config, EnvConfig(max_steps=4, topk=3), engine_config, GenerationConfig(),
                 RetrievalSource(config=eval_world["retriever"]), engine=scripted_engine(eval_tiny, plans))
    )  # fmt: skip
    assert (stats.done, stats.failed, stats.skipped) == (3, 0, 0) and stats.busy_s > 0
    rows = {row["question"]: row for _, row in iter_jsonl(out / "predictions.jsonl")}
    assert rows[right.question]["num_steps"] == 3 and rows[right.question]["num_retrievals"] == 2
    assert [s.get("query") for s in rows[right.question]["steps"]] == ["q one", "q two", None]
    assert all(len(s["documents"]) == 3 for s in rows[right.question]["steps"][:2])
    assert rows[endless.question]["answer"] is None and rows[endless.question]["num_retrievals"] == 4
    assert rows[wrong.question]["gold_ids"] == wrong.metadata["supporting_passage_ids"]
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["method"] == "r3" and manifest["retriever"] == "bm25" and manifest["env"]["topk"] == 3

    scores = asyncio.run(score_run(ScoreConfig(run=str(out)), JudgeClientConfig()))
    cell = scores["datasets"]["world"]
    assert scores["cutoffs"] == [1, 2, 3, 4] and scores["judge"] is None
    assert cell["final"]["em"] == pytest.approx(1 / 3) and cell["final"]["acc"] is None
    assert cell["by_cutoff"]["2"]["em"] == 0.0  # the right answer came at step 3
    assert cell["by_cutoff"]["2"]["answered"] == pytest.approx(1 / 3)  # only the wrong one answered by step 2
    assert cell["final"]["avg_steps"] == pytest.approx((3 + 2 + 4) / 3)
    assert cell["final"]["avg_docs"] == pytest.approx((6 + 3 + 9) / 3)  # the endless one's last 3 were never shown
    assert rows[endless.question]["num_docs"] == 9
    per_question = {row["id"]: row for _, row in iter_jsonl(out / "question_scores.jsonl")}
    assert per_question[f"world/{right.id}"]["correct"] and not per_question[f"world/{wrong.id}"]["correct"]


def test_answer_at_limit_starts_the_final_step_and_the_engine_continues_it(eval_world, eval_tiny, tmp_path):
    """A policy that would search on past max_steps answers from what it found: the environment writes the
    answer step's start into the prompt, and the scripted model writes only the answer."""
    item = eval_world["items"][0]
    gold = item.golden_answers[0]
    plans = {item.question: [query_step("first", "q one"), query_step("again", "q two"), f" {gold}"]}
    out = tmp_path / "run"
    config = EvalRunConfig(data=str(eval_world["dev"]), out=str(out), max_questions=1)
    asyncio.run(
        run_eval(config, EnvConfig(max_steps=2, topk=3, answer_at_limit=True), EngineConfig(model=str(eval_tiny)),
                 GenerationConfig(), RetrievalSource(config=eval_world["retriever"]),
                 engine=scripted_engine(eval_tiny, plans))
    )  # fmt: skip
    [(_, row)] = list(iter_jsonl(out / "predictions.jsonl"))
    assert row["answer"] == gold and row["num_retrievals"] == 2 and row["num_docs"] == 6
    scores = asyncio.run(score_run(ScoreConfig(run=str(out)), JudgeClientConfig()))  # the answer step counts
    assert scores["cutoffs"] == [1, 2, 3] and scores["datasets"]["world"]["final"]["em"] == 1.0
    assert scores["datasets"]["world"]["final"]["avg_docs"] == 6
    assert (
        row["steps"][-1]["analysis"] == OUT_OF_SEARCHES
        and json.loads((out / "run.json").read_text())["env"]["answer_at_limit"]
    )


def test_baselines_share_the_harness(eval_world, eval_tiny, tmp_path):
    item = eval_world["items"][0]
    fmt_answer = answer_step("thinking", item.golden_answers[0])
    engine = scripted_engine(eval_tiny, {item.question: [fmt_answer]})
    source = RetrievalSource(config=eval_world["retriever"])
    for method in ("direct", "naive_rag"):
        out = tmp_path / method
        config = EvalRunConfig(data=str(eval_world["dev"]), out=str(out), method=method, max_questions=1, naive_topk=7)
        asyncio.run(
            run_eval(config, EnvConfig(), EngineConfig(model=str(eval_tiny)), GenerationConfig(), source, engine=engine)
        )
        [(_, row)] = list(iter_jsonl(out / "predictions.jsonl"))
        assert row["answer"] == item.golden_answers[0] and row["answer_source"] == "format"
        assert row["num_retrievals"] == (method == "naive_rag") and row["num_docs"] == (
            7 if method == "naive_rag" else 0
        )
        scores = asyncio.run(score_run(ScoreConfig(run=str(out)), JudgeClientConfig()))
        assert scores["average"]["final"]["em"] == 1.0
        assert (scores["average"]["final"]["recall"] is None) == (method == "direct")  # nothing retrieved: no metric
        assert json.loads((out / "run.json").read_text())["retriever"] == ("bm25" if method == "naive_rag" else "none")


def test_react_runs_the_same_episode_in_its_own_format(eval_world, eval_tiny, tmp_path):
    from r3_env.protocol import Step, get_format

    react = get_format("react")
    item = eval_world["items"][1]
    steps = [react.render_step(Step("need the facts", query="who")), react.render_step(Step("so", answer="X"))]
    plans = {item.question: steps}

    class ReactScript(Script):  # the document turns of ReAct are observations, not R3's numbered blocks
        def __call__(self, prompt_ids):
            text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
            if item.question not in text:
                return None
            return self.tokenizer(steps[min(text.count("Observation:"), 1)], add_special_tokens=False)["input_ids"]

    engine = scripted_engine(eval_tiny, plans)
    engine.generator.script = ReactScript(engine.tokenizer, plans)
    out = tmp_path / "react"
    config = EvalRunConfig(data=str(eval_world["dev"]), out=str(out), method="react", max_questions=2)
    source = RetrievalSource(config=eval_world["retriever"])
    asyncio.run(
        run_eval(config, EnvConfig(), EngineConfig(model=str(eval_tiny)), GenerationConfig(), source, engine=engine)
    )
    rows = {row["question"]: row for _, row in iter_jsonl(out / "predictions.jsonl")}
    assert [s.get("query") for s in rows[item.question]["steps"]] == ["who", None]
    assert rows[item.question]["answer"] == "X"


def test_rerun_with_other_settings_is_refused(eval_world, eval_tiny, tmp_path):
    engine = scripted_engine(eval_tiny, {})
    source = RetrievalSource(config=eval_world["retriever"])
    config = EvalRunConfig(data=str(eval_world["dev"]), out=str(tmp_path / "r"), max_questions=1)
    env = EnvConfig(max_step_tokens=8)
    asyncio.run(run_eval(config, env, EngineConfig(model=str(eval_tiny)), GenerationConfig(), source, engine=engine))
    import fcntl

    with open(tmp_path / "r" / ".lock", "w") as held:  # as if another run were writing into the folder
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(ValueError, match=r"another `r3rag eval run` is writing into"):
            asyncio.run(run_eval(config, env, EngineConfig(model=str(eval_tiny)), GenerationConfig(), source))
    with pytest.raises(ValueError, match=r"env.topk: 5 -> 3.*choose another --out"):
        asyncio.run(run_eval(config, EnvConfig(max_step_tokens=8, topk=3), EngineConfig(model=str(eval_tiny)),
                             GenerationConfig(), source, engine=engine))  # fmt: skip


def test_a_run_resumes_against_the_same_index_on_another_port(eval_world, eval_tiny, tmp_path):
    """A service is recorded by what it serves, so a restarted service on a new port resumes the run."""
    config = EvalRunConfig(data=str(eval_world["dev"]), out=str(tmp_path / "r"), max_questions=1)
    env, engine = EnvConfig(max_step_tokens=8), scripted_engine(eval_tiny, {})

    def run(url: str, questions: int) -> None:
        asyncio.run(run_eval(replace(config, max_questions=questions), env, EngineConfig(model=str(eval_tiny)),
                             GenerationConfig(), RetrievalSource(url=url), engine=engine))  # fmt: skip

    with ServiceProcess(["retriever", "serve", "--config", eval_world["retriever"]]) as first:
        run(first.url, 1)
    recorded = json.loads((tmp_path / "r" / "run.json").read_text())
    assert recorded["retriever"] == "bm25"  # the service says what it is
    served = recorded["retrieval"]["service"]
    assert served["retrieval_method"] == "bm25" and served["documents"] > 0 and "url" not in served
    with ServiceProcess(["retriever", "serve", "--config", eval_world["retriever"]]) as second:
        assert second.url != first.url
        run(second.url, 2)
        # a run.json of an older r3rag knew the service by its URL: upgraded, with a warning, and resumed
        old = {**recorded, "retriever": "service", "retrieval": {"url": first.url, "config": ""}}
        (tmp_path / "r" / "run.json").write_text(json.dumps(old))
        run(second.url, 3)
        assert json.loads((tmp_path / "r" / "run.json").read_text()) == recorded
    assert len((tmp_path / "r" / "predictions.jsonl").read_text().splitlines()) == 3
    with pytest.raises(ValueError, match=r"retrieval.url: no retrieval service answers at .*r3rag retriever serve"):
        run(second.url, 4)  # stopped

    other = yaml.safe_load(Path(eval_world["retriever"]).read_text())
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(other["index_path"], elsewhere)
    (tmp_path / "other.yaml").write_text(yaml.safe_dump({**other, "index_path": str(elsewhere)}))
    with ServiceProcess(["retriever", "serve", "--config", str(tmp_path / "other.yaml")]) as moved:  # another index
        with pytest.raises(ValueError, match=r"retrieval.service.index_path: .*choose another --out"):
            run(moved.url, 4)


def _eval_command(world, model, out, questions: int) -> list[str]:
    return [sys.executable, "-m", "r3_env.cli", "eval", "run", "--data", str(world["dev"]), "--out", str(out),
            "--max_questions", str(questions), "--engine.model", str(model), "--engine.max_batch", "1",
            "--concurrency", "1", "--env.max_step_tokens", "24", "--retrieval.config", world["retriever"]]  # fmt: skip


def test_a_killed_run_resumes_without_duplicates_or_gaps(eval_world, eval_tiny, tmp_path):
    out = tmp_path / "killed"
    questions = 40
    command = _eval_command(eval_world, eval_tiny, out, questions)
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    predictions = out / "predictions.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if predictions.exists() and len(predictions.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    assert process.poll() is None, "the run finished before it could be killed; give it more questions"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    before = len(list(iter_jsonl(predictions)))
    assert 3 <= before < questions
    partial = asyncio.run(score_run(ScoreConfig(run=str(out), cutoffs="1"), JudgeClientConfig()))
    assert partial["datasets"]["world"]["missing"] == questions - before  # the killed run said what it was asked
    assert partial["datasets"]["world"]["questions"] == questions
    finished = subprocess.run(
        _eval_command(eval_world, eval_tiny, out, questions), cwd=ROOT, capture_output=True, text=True
    )
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert f"{before:,} already done" in finished.stdout
    ids = [row["id"] for _, row in iter_jsonl(predictions)]
    assert asyncio.run(score_run(ScoreConfig(run=str(out)), JudgeClientConfig()))["datasets"]["world"]["missing"] == 0
    expected = [f"world/{item.id}" for item in eval_world["items"][:questions]]
    assert len(ids) == len(set(ids)) == questions and set(ids) == set(expected)


def test_judge_acc_through_the_reward_server_is_cached(eval_world, eval_tiny, tmp_path):
    """ACC from a real reward server (lexical judge) on a real port; rescoring never asks it again."""
    items = eval_world["items"][:2]
    plans = {items[0].question: [answer_step("a", f"it is {items[0].golden_answers[0]} indeed")],
             items[1].question: [answer_step("b", "Nobody In Particular")]}  # fmt: skip
    out = tmp_path / "judged"
    config = EvalRunConfig(data=str(eval_world["dev"]), out=str(out), max_questions=2)
    source, engine = RetrievalSource(config=eval_world["retriever"]), scripted_engine(eval_tiny, plans)
    asyncio.run(run_eval(config, EnvConfig(), EngineConfig(model=str(eval_tiny)), GenerationConfig(), source,
                         engine=engine))  # fmt: skip
    reward_yaml = tmp_path / "reward.yaml"
    reward_yaml.write_text(yaml.safe_dump({"judge": {"backend": "lexical"}}))
    with ServiceProcess(["reward", "serve", "--config", str(reward_yaml)]) as service:
        scores = asyncio.run(score_run(ScoreConfig(run=str(out)), JudgeClientConfig(url=service.url)))
    assert scores["judge"] == "lexical"
    final = scores["datasets"]["world"]["final"]
    assert final["acc"] == 0.5 and final["em"] == 0.0  # the long right answer is not an exact match
    judged = [row for _, row in iter_jsonl(out / "judgements.jsonl")]
    assert len(judged) == 2 and {row["method"] for row in judged} == {"match", "judge"}
    judge = JudgeClientConfig(url=service.url)
    again = asyncio.run(score_run(ScoreConfig(run=str(out), cutoffs="1"), judge))  # the service is down now
    assert again["datasets"]["world"]["final"]["acc"] == 0.5 and len(list(iter_jsonl(out / "judgements.jsonl"))) == 2
    (out / "judgements.jsonl").unlink()  # nothing cached and the judge down: a clear failure, nothing written
    result = run_r3rag("eval", "score", "--run", str(out), "--judge.url", service.url)
    assert result.returncode == 1 and "the judge failed" in result.stderr and "Traceback" not in result.stderr


def test_bad_input_names_the_field(eval_world, tmp_path):
    result = run_r3rag("eval", "run", "--data", str(eval_world["dev"]), "--out", str(tmp_path / "x"))
    assert result.returncode == 2 and "engine.model is required" in result.stderr and "Traceback" not in result.stderr
    result = run_r3rag("eval", "score", "--run", str(tmp_path / "nothing"))
    assert result.returncode == 2 and "r3rag eval run --out" in result.stderr and "Traceback" not in result.stderr
    result = run_r3rag("eval", "sweep", "--data", "x.jsonl", "--engine.model", "m", "--sweep.retrievers", "bm25")
    assert result.returncode == 2 and "NAME=retriever.yaml" in result.stderr


def test_launch_eval_resolves_to_commands_r3rag_parses():
    import shlex

    from eval.run import SECTIONS
    from r3_env.cli import build_parser
    from r3_env.config import configs_from_args

    env = {**os.environ, "POLICY": "Qwen/Qwen2.5-7B-Instruct", "DATA": "a/dev.jsonl,b/dev.jsonl",
           "RETRIEVER_CONFIG": "e5.yaml", "METHODS": "r3,naive_rag", "TOPK": "3"}  # fmt: skip
    result = subprocess.run(["bash", str(ROOT / "launch" / "eval.sh"), "--dry-run", "--max_questions", "7"],
                            env=env, capture_output=True, text=True, check=True)  # fmt: skip
    lines = result.stdout.splitlines()
    assert lines[0].startswith("r3rag retriever serve --config e5.yaml") and "vllm serve" in result.stdout
    runs = [shlex.split(line) for line in lines if " eval run " in line]
    assert len(runs) == 2 and lines[-1] == "r3rag eval report runs/eval "
    for words in runs:
        assert words[:2] == ["env", "CUDA_VISIBLE_DEVICES=0"]
        config, run_env, engine, _, retrieval = configs_from_args(build_parser().parse_args(words[3:]), SECTIONS)
        assert (run_env.topk, run_env.max_steps, engine.kind, engine.model) == (
            3,
            5,
            "vllm",
            "Qwen/Qwen2.5-7B-Instruct",
        )
        assert retrieval.url == "http://127.0.0.1:8000" and config.retriever_name == "e5" and config.max_questions == 7
    assert {shlex.split(line)[-1] for line in lines if " eval score " in line} == {"http://127.0.0.1:8002"}


def test_a_sweep_runs_scores_and_reports_every_pair(eval_world, eval_tiny, tmp_path):
    from eval.sweep import SweepConfig, run_sweep

    item = eval_world["items"][0]
    plans = {item.question: [query_step("look", "who"), query_step("again", "what"), answer_step("so", "X")]}
    second = tmp_path / "retriever2.yaml"
    second.write_text(Path(eval_world["retriever"]).read_text())
    sweep = SweepConfig(retrievers=f"bm25={eval_world['retriever']},copy={second}", topk="1,2", max_steps=4)
    config = EvalRunConfig(data=str(eval_world["dev"]), out=str(tmp_path / "sweep"), max_questions=2)
    status = asyncio.run(
        run_sweep(config, sweep, EnvConfig(), EngineConfig(model=str(eval_tiny)), GenerationConfig(),
                  JudgeClientConfig(), engine=scripted_engine(eval_tiny, plans))
    )  # fmt: skip
    assert status == 0
    runs = sorted(p.name for p in (tmp_path / "sweep").iterdir() if (p / "scores.json").exists())
    assert runs == ["r3-bm25-k1", "r3-bm25-k2", "r3-copy-k1", "r3-copy-k2"]
    scores = json.loads((tmp_path / "sweep" / "r3-bm25-k2" / "scores.json").read_text())
    assert scores["run"]["env"]["topk"] == 2 and scores["cutoffs"] == [1, 2, 3, 4]
    rows = {row["question"]: row for _, row in iter_jsonl(tmp_path / "sweep" / "r3-bm25-k2" / "predictions.jsonl")}
    assert rows[item.question]["num_docs"] == 4  # two queries, top-2 each
    other = next(row for question, row in rows.items() if question != item.question)
    expected = (4 + other["num_docs"]) / 2
    assert scores["datasets"]["world"]["final"]["avg_docs"] == pytest.approx(expected)
    assert (tmp_path / "sweep" / "report.html").exists() and (tmp_path / "sweep" / "report.md").exists()
