"""Algorithm 1 (trajectory synthesis) against a real OpenAI-compatible teacher server and the scripted teacher.

The teacher server is a test double: a FastAPI app on a real port that answers chat completions
with canned steps per question and temperature (a strong LLM such as DeepSeek-V3 cannot run here).
Retrieval is a real BM25 index of a synthetic world.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from conftest import ROOT, InThreadServer, answer_step, query_step, run_r3rag
from fastapi import Request

from r3_env.chat_client import RateLimiter
from r3_env.coldstart.scripted import OPENINGS_AFTER_QUESTION, SHOWN_WITH_QUESTION
from r3_env.coldstart.synth import SynthConfig, best_of_n, synthesize
from r3_env.coldstart.teacher import TeacherConfig, TeacherError
from r3_env.env import EnvConfig
from r3_env.protocol import get_format
from r3_env.retrieval.index_builder import IndexBuildConfig, build_index
from r3_env.runs import JudgeClientConfig, RetrievalSource, check_manifest, load_questions
from r3_env.world.build import WorldConfig, generate_world


def make_world(root, entities: int, seed: int) -> dict:
    generate_world(WorldConfig(entities=entities, seed=seed, bm25_check=0), root / "world")
    index = build_index(IndexBuildConfig(corpus_path=str(root / "world" / "corpus.jsonl"), save_dir=str(root / "idx")))
    retriever_yaml = root / "retriever.yaml"
    retriever_yaml.write_text(yaml.safe_dump({"retrieval_method": "bm25", "index_path": str(index)}))
    return {"root": root, "retriever": str(retriever_yaml), "train": root / "world" / "train.jsonl"}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    return make_world(tmp_path_factory.mktemp("coldstart"), 200, 5)


# -- the stand-in teacher ------------------------------------------------------------------------------


class StandInTeacher:
    """Canned steps per question: ``plans[question]`` is a list of steps, a {temperature: steps} dict,
    "fail" (HTTP 503), or "length" (a reply cut off by the token limit)."""

    def __init__(self, plans: dict, delay_s: float = 0.0) -> None:
        self.plans, self.delay_s = plans, delay_s
        self.requests: list[dict] = []
        self.down = False

    def app(self):
        from fastapi import FastAPI
        from fastapi.responses import JSONResponse

        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request):
            body = await request.json()
            self.requests.append(body)
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            # the conversation's own question is the last one asked (few-shot examples come before it)
            r3, messages = get_format("r3"), body["messages"]
            start = max(i for i, m in enumerate(messages) if m["role"] == "user" and r3.find_question(m["content"]))
            question = r3.find_question(messages[start]["content"])
            plan = self.plans.get(question, [answer_step("no plan", "unknown")])
            if self.down or plan == "fail":
                return JSONResponse({"detail": "overloaded"}, status_code=503)
            finish = "stop"
            if plan == "length":
                plan, finish = [query_step("I will search for", "something that goes on and")], "length"
            if isinstance(plan, dict):
                plan = plan[body["temperature"]]
            turn = sum(m["role"] == "assistant" for m in messages[start:])
            return {
                "choices": [{"message": {"role": "assistant", "content": plan[turn]}, "finish_reason": finish}],
                "usage": {"prompt_tokens": 100 + 10 * turn, "completion_tokens": 7},
            }

        return app


def rows(world) -> list[dict]:
    return [json.loads(line) for line in world["train"].read_text().splitlines()]


def hop(row, i: int = 0) -> str:
    return row["metadata"]["question_decomposition"][i]["question"]


def teacher_config(server, **options) -> TeacherConfig:
    return TeacherConfig(kind="openai", base_url=server.url + "/v1", model="stand-in", backoff_s=0.01, **options)


def synth_config(world, out, count: int, **options) -> SynthConfig:
    data = out.parent / f"{out.name}-questions.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(world)[:count]))
    return SynthConfig(data=str(data), out=str(out), **options)


def read_rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rejection_invalid_formats_best_of_n_failures_and_usage(world, tmp_path):
    r = rows(world)
    gold = [row["golden_answers"][0] for row in r]
    plans = {
        r[0]["question"]: [query_step("I need the first fact.", hop(r[0])), answer_step("Found it.", gold[0])],
        r[1]["question"]: [query_step("Look it up.", hop(r[1])), answer_step("A guess.", "Nobody Atall")],
        r[2]["question"]: ["I will not follow the format."],
        r[3]["question"]: {
            0.8: [query_step("a", hop(r[3])), query_step("b", hop(r[3], 1)), answer_step("c", gold[3])],
            0.6: [answer_step("Straight away.", "Wrong Answer Co")],
            1.0: [query_step("a", hop(r[3])), answer_step("c", gold[3])],
        },
        r[4]["question"]: "fail",
        r[5]["question"]: "length",
    }
    stand_in = StandInTeacher(plans)
    with InThreadServer(stand_in.app()) as server:
        config = synth_config(world, tmp_path / "out", 6, samples=3)
        summary, stats = asyncio.run(
            synthesize(
                config,
                EnvConfig(),
                teacher_config(server, retries=1),
                RetrievalSource(config=world["retriever"]),
                JudgeClientConfig(),
            )
        )
    samples = {row["id"]: row for row in read_rows(tmp_path / "out" / "samples.jsonl")}
    key = [f"{config.paths()[0].parent.name}/{row['id']}" for row in r[:6]]
    # the teacher failing for one question: its samples are not written (a rerun retries them), the rest are
    assert stats.failed == 3 and stats.done == 15 and not any(k.startswith(key[4] + "#") for k in samples)
    assert "503" in stats.last_error and "overloaded" in stats.last_error
    assert samples[f"{key[0]}#0"]["outcome"] == "correct" and samples[f"{key[0]}#0"]["verdict"] == "match"
    assert samples[f"{key[0]}#0"]["steps"][0]["documents"][0]["contents"]  # full documents are kept
    assert {samples[f"{key[1]}#{k}"]["outcome"] for k in range(3)} == {"wrong"}
    invalid = samples[f"{key[2]}#0"]
    assert invalid["outcome"] == "format_error" and invalid["invalid"]["reason"] == "missing_analysis"
    assert invalid["invalid"]["output"] == "I will not follow the format."
    assert samples[f"{key[5]}#0"]["invalid"]["reason"] == "truncated"
    # best-of-N: correct, fewest steps (the 1.0 sample, index 2), one trajectory per accepted question
    kept = read_rows(tmp_path / "out" / "trajectories.jsonl")
    assert [row["id"] for row in kept] == [key[0], key[3]]
    assert kept[1]["sample"] == 2 and kept[1]["num_steps"] == 2 and kept[1]["temperature"] == 1.0
    # every request carried the protocol's rendering of the steps so far, at the sample's temperature
    second = next(b for b in stand_in.requests if len(b["messages"]) == 4)
    assert second["messages"][2]["content"] == plans[r[0]["question"]][0]
    assert second["messages"][3]["content"].startswith("Retrieved documents for step 1:")
    assert {b["temperature"] for b in stand_in.requests} == {0.8, 0.6, 1.0}
    # usage summary
    d = summary["datasets"][config.paths()[0].parent.name]
    assert d["questions"] == 6 and d["questions_sampled"] == 5 and d["trajectories"] == 2
    assert d["acceptance_rate"] == pytest.approx(2 / 5)
    assert d["outcomes"] == {"correct": 5, "format_error": 6, "wrong": 4}
    answered = sum(row["usage"]["requests"] for row in samples.values())
    assert d["requests"] == answered and d["completion_tokens"] == 7 * answered
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["datasets"] == summary["datasets"]


def test_best_of_n_prefers_correct_then_fewest_steps_then_earliest():
    def row(sample, steps, outcome="correct"):
        return {"dataset": "d", "question_id": "q", "sample": sample, "num_steps": steps, "outcome": outcome}

    best = best_of_n([row(0, 3), row(1, 1, "wrong"), row(2, 2), row(3, 2), row(4, 1, "format_error")])
    assert best["d/q"]["sample"] == 2


def test_resume_after_a_kill_has_no_duplicates_or_gaps(world, tmp_path):
    r = rows(world)
    plans = {
        row["question"]: [query_step("look", hop(row)), answer_step("done", row["golden_answers"][0])] for row in r
    }
    stand_in = StandInTeacher(plans, delay_s=0.03)
    out = tmp_path / "out"
    with InThreadServer(stand_in.app()) as server:
        config = synth_config(world, out, 30, samples=2)
        args = [
            "coldstart", "synth", "--data", config.data, "--out", str(out), "--samples", "2", "--concurrency", "2",
            "--teacher.kind", "openai", "--teacher.base_url", server.url + "/v1", "--teacher.model", "stand-in",
            "--retrieval.config", world["retriever"],
        ]  # fmt: skip
        process = subprocess.Popen(
            [sys.executable, "-m", "r3_env.cli", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        samples = out / "samples.jsonl"
        deadline = time.time() + 120
        while time.time() < deadline and (not samples.exists() or len(samples.read_text().splitlines()) < 10):
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        before = samples.read_bytes()
        assert 10 <= len(before.splitlines()) < 60
        requests_before = len(stand_in.requests)
        result = run_r3rag(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    complete = [line for line in before.splitlines(keepends=True) if line.endswith(b"\n")]
    after = samples.read_bytes()
    assert after.startswith(b"".join(complete))  # nothing already written was rewritten
    ids = [row["id"] for row in read_rows(samples)]
    assert len(ids) == len(set(ids)) == 60
    # the rerun asked only for what was missing (2 requests per sample, one sample possibly cut mid-way)
    assert len(stand_in.requests) - requests_before <= 2 * (60 - len(complete)) + 2
    assert len(read_rows(out / "trajectories.jsonl")) == 30
    assert "this run:" in result.stdout and "already done" in result.stdout


def test_a_dead_teacher_stops_the_run_with_what_to_do(world, tmp_path):
    stand_in = StandInTeacher({})
    stand_in.down = True
    with InThreadServer(stand_in.app()) as server:
        config = synth_config(world, tmp_path / "out", 20, samples=1, concurrency=1, abort_after_failures=3)
        with pytest.raises(TeacherError, match=r"3 samples in a row failed.*HTTP 503.*rerun the same command"):
            asyncio.run(
                synthesize(
                    config, EnvConfig(), teacher_config(server, retries=2), RetrievalSource(config=world["retriever"])
                )
            )
        assert len(stand_in.requests) == 3 * 3  # each request tried 1 + 2 times
    # through the CLI: a clear message and a failing exit code, no traceback
    result = run_r3rag(
        "coldstart", "synth", "--data", config.data, "--out", str(tmp_path / "cli"), "--samples", "1",
        "--concurrency", "1", "--abort_after_failures", "2", "--teacher.kind", "openai",
        "--teacher.base_url", "http://127.0.0.1:9/v1", "--teacher.model", "m", "--teacher.retries", "0",
        "--retrieval.config", world["retriever"],
    )  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "2 samples in a row failed" in result.stderr and "is the endpoint up" in result.stderr


def test_resuming_with_other_settings_is_refused(world, tmp_path):
    config = synth_config(world, tmp_path / "out", 3, samples=1)
    retrieval = RetrievalSource(config=world["retriever"])
    asyncio.run(synthesize(config, EnvConfig(), TeacherConfig(), retrieval))
    with pytest.raises(ValueError, match=r"other settings \(env.topk: 5 -> 3\); choose another --out"):
        asyncio.run(synthesize(config, EnvConfig(topk=3), TeacherConfig(), retrieval))
    with pytest.raises(ValueError, match="leave env.answer_at_limit off for cold-start synthesis"):
        asyncio.run(synthesize(config, EnvConfig(answer_at_limit=True), TeacherConfig(), retrieval))


def test_settings_are_only_binding_once_a_sample_is_written(tmp_path):
    manifest, rows = tmp_path / "synth.json", tmp_path / "samples.jsonl"
    check_manifest(manifest, rows, {"teacher": {"kind": "scripted"}})  # a run that failed before any sample ...
    check_manifest(manifest, rows, {"teacher": {"kind": "openai"}})  # ... does not bind the folder
    rows.write_text(json.dumps({"id": "d/q#0"}) + "\n")
    with pytest.raises(ValueError, match=r"teacher.kind: 'openai' -> 'scripted'"):
        check_manifest(manifest, rows, {"teacher": {"kind": "scripted"}})


def test_a_run_recorded_before_an_episode_rule_existed_resumes_under_its_default(tmp_path):
    manifest, rows = tmp_path / "run.json", tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"id": "d/q#0"}) + "\n")
    manifest.write_text(json.dumps({"env": {"topk": 5}}))  # written before env.question_docs existed
    check_manifest(manifest, rows, {"env": {"topk": 5, "question_docs": 0}})
    with pytest.raises(ValueError, match=r"env.question_docs: 0 -> 4"):
        check_manifest(manifest, rows, {"env": {"topk": 5, "question_docs": 4}})


def test_under_question_docs_the_scripted_teacher_searches_only_for_what_they_miss(world, tmp_path):
    """In the tags format too, whose first step must think before it answers (nothing was searched yet)."""
    config = synth_config(world, tmp_path / "cs", 40, step_format="tags", samples=1)
    retrieval = RetrievalSource(config=world["retriever"])
    asyncio.run(synthesize(config, EnvConfig(question_docs=4), TeacherConfig(detour_rate=1.0), retrieval))
    samples = read_rows(tmp_path / "cs" / "samples.jsonl")
    assert len(samples) == 40 and not [s for s in samples if s["outcome"] == "format_error"]
    questions = {r["question"]: r for r in rows(world)}
    openers = tuple(opening.split("{")[0] for opening in OPENINGS_AFTER_QUESTION)
    direct = 0
    for sample in samples:
        shown = {d["id"] for d in sample["question_documents"]}
        gold = set(questions[sample["question"]]["metadata"]["supporting_passage_ids"])
        queries = [step["query"] for step in sample["steps"] if "query" in step]
        assert sample["question"] not in queries  # the environment searched the question: no detour
        if not queries:
            direct += 1
            assert gold <= shown and sample["outcome"] == "correct"
            assert sample["steps"][0]["analysis"].startswith(SHOWN_WITH_QUESTION)  # the decision comes first
        else:  # the first search says what the documents shown with the question lack
            assert sample["steps"][0]["analysis"].startswith(openers)
    assert direct > 0


def test_datasets_need_distinct_names(world, tmp_path):
    with pytest.raises(ValueError, match="distinct names"):
        load_questions(SynthConfig(data=f"{world['train']},{world['train']}").paths())


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="teacher.base_url"):
        TeacherConfig(kind="openai")
    with pytest.raises(ValueError, match="exactly one of retrieval.url"):
        RetrievalSource().open()
    with pytest.raises(ValueError, match="exactly one of retrieval.url"):
        RetrievalSource(url="http://127.0.0.1:1", config="retriever.yaml")
    with pytest.raises(ValueError, match="temperatures must be numbers"):
        SynthConfig(data="x.jsonl", temperatures="hot")


def test_few_shot_examples_stand_between_the_instructions_and_the_question(world, tmp_path):
    """``teacher.few_shot``: the teacher sees the example trajectories as whole earlier conversations."""
    scripted = synth_config(world, tmp_path / "examples", 3, samples=1)
    asyncio.run(
        synthesize(scripted, EnvConfig(), TeacherConfig(kind="scripted"), RetrievalSource(config=world["retriever"]))
    )
    examples = read_rows(tmp_path / "examples" / "trajectories.jsonl")
    standin = StandInTeacher({})
    with InThreadServer(standin.app()) as server:
        teacher = teacher_config(server, few_shot=str(tmp_path / "examples" / "trajectories.jsonl"))
        config = synth_config(world, tmp_path / "asked", 1, samples=1)
        asyncio.run(synthesize(config, EnvConfig(), teacher, RetrievalSource(config=world["retriever"])))
    (request,) = standin.requests  # the stand-in has no plan for an example's question: it answers "unknown"
    messages = request["messages"]
    r3 = get_format("r3")
    assert messages[0]["role"] == "system" and all(m["role"] != "system" for m in messages[1:])
    asked = [r3.find_question(m["content"]) for m in messages if m["role"] == "user" and r3.find_question(m["content"])]
    assert asked == [examples[0]["question"], examples[1]["question"], rows(world)[0]["question"]]  # two shots, then it
    first = [m for m in messages[1:] if m["role"] == "assistant"][: len(examples[0]["steps"])]
    assert [r3.parse_step(m["content"]).query for m in first[:-1]] == [s["query"] for s in examples[0]["steps"][:-1]]
    assert json.loads((tmp_path / "asked" / "synth.json").read_text())["teacher"]["few_shot_count"] == 2
    with pytest.raises(ValueError, match="teacher.few_shot prompts a model"):
        TeacherConfig(kind="scripted", few_shot=str(tmp_path / "examples" / "trajectories.jsonl"))
    with pytest.raises(ValueError, match="teacher.few_shot: .* does not exist"):
        teacher_config(server, few_shot=str(tmp_path / "none.jsonl"))


def test_rate_limit_spaces_requests():
    async def main():
        limiter = RateLimiter(20.0)  # 1,200 requests per minute
        started = time.monotonic()
        await asyncio.gather(*(limiter.wait() for _ in range(6)))
        return time.monotonic() - started

    assert asyncio.run(main()) >= 5 / 20 - 0.01


# -- the scripted teacher on the synthetic world ------------------------------------------------------------


def test_scripted_teacher_solves_at_least_95_percent_of_a_1000_question_world(tmp_path):
    big = make_world(tmp_path, 2000, 0)
    config = SynthConfig(data=str(big["train"]), out=str(tmp_path / "out"), samples=2, concurrency=32)
    summary, _ = asyncio.run(synthesize(config, EnvConfig(), TeacherConfig(), RetrievalSource(config=big["retriever"])))
    d = summary["datasets"]["world"]
    assert d["questions_sampled"] == 1000 and d["samples"] == 2000
    assert d["acceptance_rate"] >= 0.95, d
    fmt = get_format("r3")
    samples = read_rows(tmp_path / "out" / "samples.jsonl")
    questions = {json.loads(line)["id"]: json.loads(line) for line in big["train"].read_text().splitlines()}
    detours = 0
    for row in samples:
        steps = row["steps"]
        for step in steps:  # every step is well formed in the protocol
            text = fmt.render_step(fmt.parse_step(fmt.render_step(_step(step))))
            assert fmt.parse_step(text) == _step(step)
        if row["outcome"] != "correct":
            continue
        shown = {doc["id"] for step in steps for doc in step.get("documents", [])}
        item = questions[row["question_id"]]
        assert set(item["metadata"]["supporting_passage_ids"]) <= shown  # it answered from retrieved evidence
        if steps[0].get("query") == row["question"] and len(steps) > 2:
            detours += 1
            assert "too broad" in steps[1]["analysis"] and steps[1]["query"] != row["question"]
    assert detours >= 50  # about 15% start too broad; those not answered at once are split
    # wording varies across samples of the same question
    first_queries = {row["steps"][0].get("query") for row in samples}
    assert len(first_queries) > 1000


def _step(row):
    from r3_env.protocol import Step

    return Step(row["analysis"], query=row.get("query"), answer=row.get("answer"))


def test_rl_data_leaves_out_the_cold_starts_questions_and_samples_the_rest(tmp_path):
    """`r3rag coldstart rl-data`: the rows the cold start did not ask, a seeded sample per dataset with their
    metadata; the same command again writes nothing new, other settings are refused, bad flags name the field."""
    for dataset in ("hotpotqa", "musique"):
        rows = [
            {"id": f"q{i}", "question": f"{dataset} question {i}?", "golden_answers": [f"a{i}"],
             "metadata": {"supporting_passage_ids": [str(i)]}}
            for i in range(10)
        ]  # fmt: skip
        (tmp_path / dataset).mkdir()
        (tmp_path / dataset / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    asked = [("hotpotqa", "q1"), ("hotpotqa", "q2"), ("hotpotqa", "q2"), ("musique", "q9")]  # best-of-N: q2 twice
    samples = tmp_path / "coldstart" / "samples.jsonl"
    samples.parent.mkdir()
    samples.write_text("".join(json.dumps({"dataset": d, "question_id": q, "sample": 0}) + "\n" for d, q in asked))
    data = f"{tmp_path / 'hotpotqa' / 'train.jsonl'},{tmp_path / 'musique' / 'train.jsonl'}"
    out = tmp_path / "rl.jsonl"
    args = ("coldstart", "rl-data", "--data", data, "--exclude", str(samples), "--per_dataset", "5", "--out", str(out))

    result = run_r3rag(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    written = read_rows(out)
    by_dataset = {d: [row for row in written if row["question"].startswith(d)] for d in ("hotpotqa", "musique")}
    assert [len(rows) for rows in by_dataset.values()] == [5, 5]
    left_out = {"hotpotqa question 1?", "hotpotqa question 2?", "musique question 9?"}
    assert not left_out & {row["question"] for row in written}
    ids = [int(row["id"][1:]) for row in by_dataset["hotpotqa"]]
    assert ids == sorted(ids)  # the file's order
    assert all(row["metadata"]["supporting_passage_ids"] == [row["id"][1:]] for row in written)
    assert "hotpotqa" in result.stdout and "10 RL questions" in result.stdout
    stats = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()[1:3]}
    assert stats == {"hotpotqa": ["10", "2", "5", "5"], "musique": ["10", "1", "5", "5"]}
    # the label OpenRLHF hands the agent (one field, LABEL_KEY=label) holds the answers and the gold passages
    from openrlhf.datasets.prompts_dataset import preprocess_data

    from r3_env.data import read_label

    prompt, label = preprocess_data(written[0], input_key="question", label_key="label")
    parsed = read_label(label)
    assert prompt == written[0]["question"] and parsed.question == prompt
    assert parsed.golden_answers == written[0]["golden_answers"] and parsed.gold_ids == [written[0]["id"][1:]]

    assert run_r3rag(*args).returncode == 0 and read_rows(out) == written  # the same settings: nothing new
    other_seed = run_r3rag(*args, "--seed", "1")
    assert other_seed.returncode == 2 and "--out" in other_seed.stderr and read_rows(out) == written
    everything = run_r3rag(*args[:-4], "--out", str(tmp_path / "all.jsonl"))  # no sample: all 17 left
    assert everything.returncode == 0 and len(read_rows(tmp_path / "all.jsonl")) == 17

    negative = run_r3rag(*args[:-2], "--per_dataset", "-1", "--out", str(tmp_path / "x.jsonl"))
    assert negative.returncode == 2 and "per_dataset" in negative.stderr
    not_samples = run_r3rag(*args[:4], "--exclude", data.split(",")[0], "--out", str(tmp_path / "y.jsonl"))
    assert not_samples.returncode == 2 and "exclude" in not_samples.stderr and "question_id" in not_samples.stderr
    folder = run_r3rag(*args[:-2], "--out", str(tmp_path))
    assert folder.returncode == 2 and "is a folder" in folder.stderr
    everything_asked = tmp_path / "asked.jsonl"
    everything_asked.write_text("".join(json.dumps({"dataset": "musique", "question_id": f"q{i}"}) + "\n"
                                        for i in range(10)))  # fmt: skip
    none_left = run_r3rag("coldstart", "rl-data", "--data", data.split(",")[1], "--exclude", str(everything_asked),
                          "--out", str(tmp_path / "z.jsonl"))  # fmt: skip
    assert none_left.returncode == 2 and "none is left" in none_left.stderr
