"""The local trainer: model factory, SFT, and PPO with OpenRLHF's own functions, against real services.

The retrieval service and the reward server (lexical judge) run as their own processes on free
ports; the policy is the model factory's tiny random Qwen2. Scripted steps (HFEngine's constrained
decoding) make the episodes known, so the rewards and where they land can be checked exactly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, Script, ServiceProcess, answer_step, query_step, save_tiny_causal_lm
from transformers import AutoModelForCausalLM

from demo.services import VLLMServer
from r3_env.config import ConfigError
from r3_env.data import iter_corpus, iter_jsonl, read_dataset
from r3_env.engines import SamplingParams, VLLMServerEngine, VLLMServerError
from r3_env.openrlhf.figures import latest_attempts
from r3_env.protocol import ChatRenderer, Step, Turn
from r3_env.retrieval.index_builder import IndexBuildConfig, build_index
from r3_env.rollout_config import RolloutConfig
from r3_env.train.config import HealthConfig, ModelConfig, PPOConfig, RunConfig, SFTConfig
from r3_env.train.model_factory import TinyModelConfig, build_tiny_policy
from r3_env.train.models import load_tokenizer, save_policy
from r3_env.train.ppo import _measured
from r3_env.world.build import WorldConfig, generate_world

TINY = TinyModelConfig(vocab_size=600, hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A 150-entity world with its BM25 index, both services running, and the tiny policy."""
    root = tmp_path_factory.mktemp("train")
    generate_world(WorldConfig(entities=150, seed=11, bm25_check=0), root / "world")
    index = build_index(IndexBuildConfig(corpus_path=str(root / "world" / "corpus.jsonl"), save_dir=str(root / "idx")))
    (root / "retriever.yaml").write_text(yaml.safe_dump({"retrieval_method": "bm25", "index_path": str(index)}))
    (root / "reward.yaml").write_text(yaml.safe_dump({"judge": {"backend": "lexical"}}))
    policy = build_tiny_policy(root / "world", root / "policy0", TINY)
    items = [i for i in read_dataset(root / "world" / "train.jsonl") if i.metadata["hops"] == 2]
    with (
        ServiceProcess(["retriever", "serve", "--config", str(root / "retriever.yaml")]) as retriever,
        ServiceProcess(["reward", "serve", "--config", str(root / "reward.yaml")]) as reward,
    ):
        rollout = RolloutConfig.from_dict(
            {
                "env": {"max_step_tokens": 48, "format_retries": 0},
                "services": {"retriever_url": retriever.url, "reward_url": reward.url},
            }
        )
        yield {"root": root, "policy": policy, "items": items, "rollout": rollout}


def gold_plan(item) -> list[str]:
    """The steps that answer ``item`` from its gold decomposition: one query per hop, then the answer."""
    hops = item.metadata["question_decomposition"]
    return [query_step(f"I need hop {i + 1}.", hop["question"]) for i, hop in enumerate(hops)] + [
        answer_step("The documents give it.", item.golden_answers[0])
    ]


def make_trainer(world, tmp_path, model: ModelConfig | None = None, **ppo):
    from r3_env.train.ppo import PPOTrainer

    settings = {
        "prompts": str(world["root"] / "world" / "train.jsonl"),
        "rollout_batch_size": 2,
        "n_samples_per_prompt": 2,
        "micro_batch_size": 2,
        "train_batch_size": 4,
        "max_len": 2048,
        **ppo,
    }
    config = PPOConfig(**settings)
    run = RunConfig(out=str(tmp_path / "run"), seed=3, device="cpu", save_every=1)
    model = model or ModelConfig(policy=str(world["policy"]))
    return PPOTrainer(run, model, config, world["rollout"], str(world["policy"]))


def with_reward_placement(world, placement: str) -> dict:
    """The world fixture with its rollout's reward placed ``placement`` ("scalar" for a group baseline)."""
    reward = dataclasses.replace(world["rollout"].reward, placement=placement)
    return {**world, "rollout": dataclasses.replace(world["rollout"], reward=reward)}


# -- model factory ------------------------------------------------------------------------------------


def test_model_factory_builds_a_tokenizer_for_the_world_and_the_protocol(world, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(world["policy"])
    model = AutoModelForCausalLM.from_pretrained(world["policy"])
    assert model.config.model_type == "qwen2" and model.config.hidden_size == 32
    assert len(tokenizer) == TINY.vocab_size == model.config.vocab_size
    renderer = ChatRenderer(tokenizer)  # its checks pass: prefix-consistent ChatML, a stop token per step
    item = world["items"][0]
    turns = [Turn(Step("I need the first fact.", query="who directed it"), ()), Turn(Step("So.", answer="Ann"))]
    renderer.check_tokenization(item.question, turns)
    text = renderer.transcript(item.question, turns)
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text  # byte-level: any text round-trips
    step = renderer.format.render_step(Step("a", query="b"))
    assert len(tokenizer.tokenize(step)) < len(step) / 3  # the protocol's markers are learnt, not spelt out
    # the same settings keep the folder; others are refused unless overwrite
    assert build_tiny_policy(world["root"] / "world", world["policy"], TINY) == world["policy"]
    with pytest.raises(ValueError, match="hidden_size"):
        build_tiny_policy(world["root"] / "world", world["policy"], TinyModelConfig(hidden_size=64, heads=2))
    with pytest.raises(ValueError, match="must divide"):
        TinyModelConfig(hidden_size=30, heads=4)


# -- SFT ----------------------------------------------------------------------------------------------


def gold_sft_data(world, out: Path, questions: int = 6) -> Path:
    """The first ``questions`` questions' gold decompositions as cold-start trajectories (each hop with its gold
    passage), written as SFT transcripts by ``r3rag coldstart sft-data``'s builder."""
    from r3_env.coldstart.sft_data import SFTDataConfig, build_sft_data

    passages = {p.id: p.to_json() for p in iter_corpus(world["root"] / "world" / "corpus.jsonl")}
    trajectories = out / "trajectories.jsonl"
    rows = []
    for item in world["items"][:questions]:
        hops = item.metadata["question_decomposition"]
        steps = [
            {"analysis": f"I need hop {i + 1}.", "query": h["question"], "documents": [passages[h["passage_id"]]]}
            for i, h in enumerate(hops)
        ]
        steps.append({"analysis": "The documents give it.", "answer": item.golden_answers[0]})
        rows.append(
            {
                "id": item.id,
                "question": item.question,
                "golden_answers": item.golden_answers,
                "outcome": "correct",
                "steps": steps,
            }
        )
    trajectories.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sft_data = out / "sft.jsonl"
    build_sft_data(SFTDataConfig(input=str(trajectories), out=str(sft_data), tokenizer=str(world["policy"])))
    return sft_data


def test_sft_learns_the_cold_start_steps_and_resumes(world, tmp_path):
    from r3_env.train.metrics import MetricsLog, read_metrics
    from r3_env.train.sft import run_sft

    sft_data = gold_sft_data(world, tmp_path)
    run = RunConfig(out=str(tmp_path / "run"), seed=0, device="cpu")
    sft = SFTConfig(data=str(sft_data), epochs=8, lr=2e-2, batch_size=2, micro_batch_size=1, lr_warmup_ratio=0.0)
    metrics = MetricsLog(tmp_path / "run")
    policy = run_sft(run, ModelConfig(policy=str(world["policy"])), sft, world["rollout"], metrics)
    metrics.close()
    losses = [row["loss"] for row in read_metrics(tmp_path / "run") if row["stage"] == "sft"]
    assert len(losses) == 8 * 3 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-3:]) < 0.6 * sum(losses[:3])  # it learns the steps, not a flat line
    assert (policy / "model.safetensors").is_file() and (policy.parent / "done.json").is_file()
    # a finished SFT is not run again
    assert (
        run_sft(run, ModelConfig(policy=str(world["policy"])), sft, world["rollout"], MetricsLog(tmp_path / "x"))
        == policy
    )


# -- PPO ----------------------------------------------------------------------------------------------


def test_known_step_rewards_reach_their_tokens_in_the_trainers_advantages(world, tmp_path):
    """GAE with gamma = lambda = 1 and no KL: the return at a step's tokens is the sum of its and later rewards."""
    trainer = make_trainer(world, tmp_path, lambd=1.0, init_kl_coef=0.0)
    try:
        tokens = list(range(5, 45))
        ranges = [(10, 14), (20, 25), (33, 40)]  # prompt, step, documents, step, documents, step
        rewards = [0.5, -0.25, 2.0]
        response = {
            "prompt": "q",
            "label": "[]",
            "observation_tokens": tokens,
            "action_ranges": ranges,
            "rollout_log_probs": None,
            "reward": sum(rewards),
            "scores": 1.0,
            "truncated": False,
            "extra_logs": {},
            "step_rewards": rewards,
        }
        [batch] = trainer.make_experiences([response, dict(response, step_rewards=[0.0, 0.0, 1.0], reward=1.0)])
        mask = batch.action_mask[0].bool()
        for start, end in ranges:  # action tokens (position j predicts token j + 1) are trained on ...
            assert mask[start - 1 : end - 1].all()
        assert mask.sum() == sum(end - start for start, end in ranges)  # ... and nothing else
        returns = batch.returns[0]
        remaining = sum(rewards)
        for (start, end), reward in zip(ranges, rewards, strict=True):
            assert returns[start - 1 : end - 1].tolist() == pytest.approx([remaining] * (end - start), abs=1e-5)
            remaining -= reward
        assert batch.returns[1][ranges[0][0] - 1] == pytest.approx(1.0)
        assert batch.advantages[mask[None].expand_as(batch.advantages)].abs().sum() > 0
    finally:
        trainer.close()


def test_one_ppo_iteration_on_scripted_episodes_updates_both_models_with_finite_losses(world, tmp_path):
    log = tmp_path / "trajectories.jsonl"
    policy = dataclasses.replace(world["rollout"].policy, trajectory_log=str(log))
    world = {**world, "rollout": dataclasses.replace(world["rollout"], policy=policy)}
    trainer = make_trainer(world, tmp_path)
    try:
        trainer.load_prompts()
        trainer.items = world["items"][:2]
        trainer.engine.script = Script(trainer.tokenizer, {i.question: gold_plan(i) for i in trainer.items})
        actor_before = [p.detach().clone() for p in trainer.actor.parameters()]
        critic_before = [p.detach().clone() for p in trainer.critic.parameters()]
        values = trainer.step()
        assert values["episodes"] == 4 and values["correct"] == 1.0 and values["format_error"] == 0.0
        assert values["reward"] > 2.0  # the answer's +2 plus the relevance of the gold documents
        assert values["steps"] == 3.0 and values["retrievals"] == 2.0 and values["docs_read"] > 0
        # every episode searched, and its searches found the gold passages: what searching paid
        assert values["searched"] == 1.0 and values["found_gold"] == 1.0
        assert values["reward_searched"] == values["reward"] and "reward_not_searched" not in values
        for key in ("policy_loss", "value_loss", "entropy", "kl", "actor_grad_norm", "critic_grad_norm"):
            assert math.isfinite(values[key]), key
        assert values["generation_s"] > 0 and values["retrieval_s"] > 0 and values["judging_s"] > 0
        assert 0.1 < values["peak_rss_gib"] < 1024  # a torch process holding two models, in GiB
        assert any(not torch.equal(a, b) for a, b in zip(actor_before, trainer.actor.parameters(), strict=True))
        assert any(not torch.equal(a, b) for a, b in zip(critic_before, trainer.critic.parameters(), strict=True))
        trainer.save()
        saved = [p.detach().clone() for p in trainer.actor.parameters()]
        trainer.step()  # a second iteration, lost to a crash before its checkpoint
    finally:
        trainer.close()
    resumed = make_trainer(world, tmp_path)
    try:
        resumed.items = world["items"][:2]
        assert resumed.resume() and resumed.iteration == 1 and resumed.position == 2
        assert all(torch.equal(a, b) for a, b in zip(saved, resumed.actor.parameters(), strict=True))
        resumed.engine.script = Script(resumed.tokenizer, {i.question: gold_plan(i) for i in resumed.items})
        resumed.step()  # the lost iteration again: its episodes are logged twice, and read once
        rows = [row for _, row in iter_jsonl(log)]
        assert [row["training_step"] for row in rows] == [0] * 4 + [1] * 8
        assert rows[0]["run"] == rows[7]["run"] != rows[8]["run"]
        assert latest_attempts(rows) == rows[:4] + rows[8:]
        resumed.items = world["items"][1:3]  # the prompts changed under the checkpoint: its place means nothing
        with pytest.raises(ValueError, match=r"trained on 2 questions and this run draws from 2, 1 of the checkpoint"):
            resumed.resume()
        resumed.items = world["items"][1::-1]
        with pytest.raises(ValueError, match=r"draws from 2, in another order"):
            resumed.resume()
    finally:
        resumed.close()


def test_a_ppo_iteration_without_a_reference_logs_no_kl_and_trains_only_the_last_layers(world, tmp_path):
    """The CPU settings that buy more episodes per second: ``init_kl_coef`` 0 loads no reference model (no made-up
    KL of 0 is logged or watched, and the log line says n/a, not nan), and ``trainable_layers`` 1 leaves the layer
    below and the embeddings as they were."""
    # the world's policy has one layer
    policy = save_tiny_causal_lm(tmp_path / "two_layers", load_tokenizer(str(world["policy"])))
    model = ModelConfig(policy=str(policy), trainable_layers=1)
    trainer = make_trainer({**world, "policy": policy}, tmp_path, model, init_kl_coef=0.0)
    try:
        assert trainer.reference is None
        trainer.load_prompts()
        trainer.items = world["items"][:2]
        trainer.engine.script = Script(trainer.tokenizer, {i.question: gold_plan(i) for i in trainer.items})
        before = {name: p.detach().clone() for name, p in trainer.actor.named_parameters()}
        values = trainer.step()
        assert values["actor_trained"] == 1.0 and "kl" not in values and math.isfinite(values["returns"])
        assert _measured(values, "kl") == "n/a" and _measured(values, "entropy") == f"{values['entropy']:.4f}"
        changed = {name for name, p in trainer.actor.named_parameters() if not torch.equal(before[name], p)}
        assert changed and all(".layers.1." in name or name.endswith("norm.weight") for name in changed), changed
    finally:
        trainer.close()


def test_ppo_ptx_adds_the_teachers_sft_loss_to_each_actor_step_and_resumes_its_place(world, tmp_path):
    """``ppo.ptx_data``: each actor step also takes the SFT loss of ``ptx_batch_size`` teacher transcripts. At
    ``ptx_coef`` 0 the update is the RL-only one; at 1 it differs; the checkpoint keeps the transcripts' place."""
    sft_data = gold_sft_data(world, tmp_path, questions=3)
    updated = []
    for name, ptx in (("rl", {}), ("ptx0", {"ptx_coef": 0.0}), ("ptx1", {"ptx_coef": 1.0})):
        if ptx:
            ptx = {**ptx, "ptx_data": str(sft_data), "ptx_batch_size": 2}
        trainer = make_trainer(world, tmp_path / name, estimator="reinforce", **ptx)
        try:
            script_one_right_one_wrong(trainer, world)
            values = trainer.step()  # 4 episodes, one actor step
            if ptx:
                assert math.isfinite(values["ptx_loss"]) and values["ptx_loss"] > 0
                assert trainer.updates.ptx_position == 2
                trainer.save()
            else:
                assert "ptx_loss" not in values
            updated.append([p.detach().clone() for p in trainer.actor.parameters()])
        finally:
            trainer.close()
    rl, ptx0, ptx1 = updated
    assert all(torch.equal(a, b) for a, b in zip(rl, ptx0, strict=True))
    assert any(not torch.allclose(a, b) for a, b in zip(rl, ptx1, strict=True))
    resumed = make_trainer(world, tmp_path / "ptx1", estimator="reinforce", ptx_data=str(sft_data), ptx_coef=1.0)
    try:
        assert resumed.resume() and resumed.updates.ptx_position == 2
    finally:
        resumed.close()
    with pytest.raises(FileNotFoundError, match=r"ppo\.ptx_data .*r3rag coldstart sft-data"):
        make_trainer(world, tmp_path / "missing", ptx_data=str(tmp_path / "nothing.jsonl"))


def test_ptx_select_failed_guides_only_the_questions_whose_samples_were_all_wrong(world, tmp_path, monkeypatch):
    """``ppo.ptx_select failed``: the RL step also takes ``ptx_coef`` times the SFT loss of the teacher's
    transcripts of the questions none of whose samples was right, looked up by question id (coldstart's
    ``<dataset>/<id>`` too). At ``ptx_coef`` 0 the update is RL's own, so the coefficient weighs the guidance
    against the policy loss; with no RL batch the guidance takes a step of its own."""
    from r3_env.train.guidance import question_key

    assert question_key("hotpotqa/5a8c", "hotpotqa") == "5a8c" and question_key("q-7", "") == "q-7"
    sft_data = gold_sft_data(world, tmp_path, questions=3)
    guided = {"ptx_data": str(sft_data), "ptx_select": "failed"}
    trainers = {
        "rl": make_trainer(world, tmp_path / "rl", estimator="reinforce"),
        "coef0": make_trainer(world, tmp_path / "coef0", estimator="reinforce", **guided, ptx_coef=0.0),
        "coef1": make_trainer(world, tmp_path / "coef1", estimator="reinforce", **guided, ptx_coef=1.0),
    }
    asked: list[str] = []
    lookup = trainers["coef1"].guide.transcripts
    monkeypatch.setattr(trainers["coef1"].guide, "transcripts", lambda ids: asked.extend(ids) or lookup(ids))
    try:
        updated = {}
        for name, trainer in trainers.items():
            script_one_right_one_wrong(trainer, world)
            values = trainer.step()  # 4 episodes, one actor step
            updated[name] = [p.detach().clone() for p in trainer.actor.parameters()]
            assert trainer.updates.actor_sched.last_epoch == 1  # the guidance joined the RL step: no step of its own
        right, wrong = trainers["coef1"].items
        assert asked == [wrong.id] and right.id in trainers["coef1"].guide and wrong.id in trainers["coef1"].guide
        assert values["failed_questions"] == 1.0 and values["ptx_questions"] == 1.0 and values["ptx_loss"] > 0
        assert all(torch.equal(a, b) for a, b in zip(updated["rl"], updated["coef0"], strict=True))
        assert any(not torch.allclose(a, b) for a, b in zip(updated["rl"], updated["coef1"], strict=True))
        right_only = make_trainer(world, tmp_path / "right", **guided)
        try:
            script_one_right_one_wrong(right_only, world)
            right_only.items = right_only.items[:1]
            values = right_only.step()
            assert values["failed_questions"] == 0.0 and "ptx_loss" not in values
        finally:
            right_only.close()
        # both samples wrong alike: a group baseline keeps no group for RL, so the guidance steps alone
        grouped = with_reward_placement(world, "scalar")
        wrong_only = make_trainer(grouped, tmp_path / "wrong", **guided, filter_groups=True, estimator="group_norm")
        try:
            script_one_right_one_wrong(wrong_only, world)
            wrong_only.items = wrong_only.items[1:]
            values = wrong_only.step()
            assert values["trained_share"] == 0.0 and values["ptx_loss"] > 0 and values["actor_trained"] == 1.0
            assert "policy_loss" not in values and wrong_only.updates.actor_sched.last_epoch == 1
        finally:
            wrong_only.close()
    finally:
        for trainer in trainers.values():
            trainer.close()
    with pytest.raises(ValueError, match=r"ppo\.ptx_select failed .*set ppo\.ptx_data"):
        PPOConfig(ptx_select="failed")
    no_ids = tmp_path / "no_ids.jsonl"
    no_ids.write_text("".join(json.dumps({"messages": json.loads(line)["messages"]}) + "\n"
                              for line in sft_data.read_text().splitlines()))  # fmt: skip
    with pytest.raises(ValueError, match=r"ppo\.ptx_data .* has no 'id' column"):
        make_trainer(world, tmp_path / "no_ids", ptx_data=str(no_ids), ptx_select="failed")


@pytest.mark.slow
def test_one_ppo_iteration_of_a_real_instruct_model(world, smollm2_model, tmp_path):
    """SmolLM2-135M-Instruct (the registry's) samples its own steps, then one PPO update of actor and critic."""
    rollout = RolloutConfig.from_dict(
        {
            "env": {"max_steps": 2, "topk": 2, "max_step_tokens": 48, "format_retries": 0},
            "services": {"retriever_url": world["rollout"].services.retriever_url,
                         "reward_url": world["rollout"].services.reward_url},
        }
    )  # fmt: skip
    trainer = make_trainer({**world, "policy": smollm2_model, "rollout": rollout}, tmp_path, max_len=1536)
    try:
        trainer.load_prompts()
        trainer.items = world["items"][:2]
        actor_before = [p.detach().clone() for p in trainer.actor.parameters()]
        values = trainer.step()
        assert values["episodes"] == 4 and values["response_tokens"] > 0
        assert sum(values[k] for k in ("correct", "wrong", "no_answer", "format_error")) == pytest.approx(1.0)
        for key in ("policy_loss", "value_loss", "entropy", "kl", "actor_grad_norm", "critic_grad_norm", "reward"):
            assert math.isfinite(values[key]), key
        assert values["entropy"] > 0.1  # a real model's sampling distribution, not a forced script
        assert any(not torch.equal(a, b) for a, b in zip(actor_before, trainer.actor.parameters(), strict=True))
    finally:
        trainer.close()


def test_the_entropy_bonus_reaches_the_gradients_only_when_its_coefficient_is_set(world, tmp_path):
    """At entropy_coef 0 the entropy is logged without a graph through it; a coefficient changes the update."""
    updated, entropies = [], []
    for coef in (0.0, 0.5):
        trainer = make_trainer(world, tmp_path / str(coef), estimator="reinforce", entropy_coef=coef)
        try:
            script_one_right_one_wrong(trainer, world)
            values = trainer.step()  # 4 episodes, one optimizer step: the entropy is measured before it
            entropies.append(values["entropy"])
            updated.append([p.detach().clone() for p in trainer.actor.parameters()])
        finally:
            trainer.close()
    assert entropies[0] == pytest.approx(entropies[1], rel=1e-5) and entropies[0] > 0
    assert any(not torch.allclose(a, b) for a, b in zip(*updated, strict=True))


@pytest.mark.parametrize(
    ("settings", "placement", "check"),
    [
        (
            {"critic_warmup": 1, "estimator": "gae"},
            "step",
            lambda v: "policy_loss" not in v and math.isfinite(v["value_loss"]) and math.isfinite(v["kl"]),
        ),
        # scripted episodes repeat per question, so each question's two samples get the same reward; no KL is
        # measured then, and the KL controller is left as it was
        (
            {"filter_groups": True, "estimator": "group_norm", "kl_target": 0.1},
            "scalar",
            lambda v: v["trained_share"] == 0.0 and "kl" not in v and "returns" not in v and v["kl_coef"] == 0.01,
        ),
    ],
    ids=["critic_warmup", "uniform_groups_filtered"],
)
def test_an_iteration_that_must_not_train_the_actor_leaves_it_alone(world, tmp_path, settings, placement, check):
    trainer = make_trainer(with_reward_placement(world, placement), tmp_path, **settings)
    try:
        trainer.load_prompts()
        trainer.items = world["items"][:2]
        trainer.engine.script = Script(trainer.tokenizer, {i.question: gold_plan(i) for i in trainer.items})
        before = [p.detach().clone() for p in trainer.actor.parameters()]
        values = trainer.step()
        assert values["episodes"] == 4 and values["actor_trained"] == 0.0 and check(values)
        assert all(torch.equal(a, b) for a, b in zip(before, trainer.actor.parameters(), strict=True))
    finally:
        trainer.close()


def test_group_filter_keeps_only_questions_whose_samples_differ():
    from r3_env.train.ppo import differing_groups

    responses = [{"reward": r, "n": i} for i, r in enumerate([1.0, 1.0, 0.0, 2.0, -0.9, -0.9, 0.5, 0.5000001])]
    assert [r["n"] for r in differing_groups(responses, 2)] == [2, 3]
    assert [r["n"] for r in differing_groups(responses, 4)] == [0, 1, 2, 3, 4, 5, 6, 7]
    for settings in ({"estimator": "group_norm", "n_samples_per_prompt": 1}, {"estimator": "reinforce"}):
        with pytest.raises(ValueError, match="set ppo.estimator group_norm and ppo.n_samples_per_prompt >= 2"):
            PPOConfig(filter_groups=True, **settings)


def test_prompt_filter_missing_gold_keeps_the_questions_whose_start_documents_miss_a_gold_passage(world, tmp_path):
    """ppo.prompt_filter missing_gold against the real retriever: a question is kept exactly when its start documents
    (its label's, then its top env.question_docs, asked of the service here, independently) lack one of its gold
    passages; rows without gold ids or with an unreadable label are left out, each counted, and a filter that keeps
    nothing says what to change. The CLI writes the same questions for the cluster path."""
    from r3_env.data import write_jsonl
    from r3_env.retrieval.client import RetrievalClient
    from r3_env.train.ppo import PPOTrainer

    k = 3
    env = dataclasses.replace(world["rollout"].env, question_docs=k)
    rollout = dataclasses.replace(world["rollout"], env=env)
    items = read_dataset(world["root"] / "world" / "train.jsonl")
    client = RetrievalClient(rollout.services.retriever_url)
    try:
        tops = client.search([item.question for item in items], k)
    finally:
        client.close()
    found = {item.id: {hit.passage.id for hit in hits} for item, hits in zip(items, tops, strict=True)}
    missing = {item.id: set(item.metadata["supporting_passage_ids"]) - found[item.id] for item in items}
    expected = [item.id for item in items if missing[item.id]]
    assert 0 < len(expected) < len(items)  # the world has questions of both kinds: the filter has work to do

    rows = [item.to_json() for item in items]
    for row in rows[:5]:  # rows naming no gold passage cannot be judged: left out
        row["metadata"] = {key: v for key, v in row["metadata"].items() if key != "supporting_passage_ids"}
    rows[5]["metadata"]["start_documents"] = "not a list"  # its episodes would score neutral: left out
    # a question whose label's start documents hold the gold passages its own documents miss: nothing to find
    given = next(row for row in rows[6:] if missing[row["id"]])
    given["metadata"]["start_documents"] = [{"id": i, "contents": "given"} for i in sorted(missing[given["id"]])]
    left_out = {row["id"] for row in rows[:6]} | {given["id"]}
    kept = [i for i in expected if i not in left_out]
    all_found = len(items) - len(expected) - sum(1 for row in rows[:6] if not missing[row["id"]]) + 1
    write_jsonl(tmp_path / "prompts.jsonl", rows)
    run = RunConfig(out=str(tmp_path / "run"), seed=3, device="cpu")
    config = PPOConfig(prompts=str(tmp_path / "prompts.jsonl"), prompt_filter="missing_gold", rollout_batch_size=2,
                       n_samples_per_prompt=2, micro_batch_size=2, train_batch_size=4)  # fmt: skip
    trainer = PPOTrainer(run, ModelConfig(policy=str(world["policy"])), config, rollout, str(world["policy"]))
    try:
        trainer.load_prompts()
        assert [item.id for item in trainer.items] == kept
        command = [sys.executable, "-m", "r3_env.train.searchable", "--prompts", str(tmp_path / "prompts.jsonl"),
                   "--retriever_url", rollout.services.retriever_url, "--question_docs", str(k),
                   "--out", str(tmp_path / "searchable.jsonl")]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert result.returncode == 0, result.stderr[-3000:]
        assert [item.id for item in read_dataset(tmp_path / "searchable.jsonl")] == kept
        assert (f"{len(kept)} of {len(items)} questions kept ({all_found} had every gold passage in their start "
                "documents, 5 name no gold passage, 1 have an unreadable label)") in result.stderr  # fmt: skip
        # only rows without gold ids: nothing to train on
        write_jsonl(tmp_path / "none.jsonl", rows[:5])
        trainer.ppo = dataclasses.replace(config, prompts=str(tmp_path / "none.jsonl"))
        with pytest.raises(ValueError, match=r"0 of 5 questions kept .*5 name no gold passage.*ppo.prompt_filter none"):
            trainer.load_prompts()
    finally:
        trainer.close()


def test_a_scheme_that_needs_gold_ids_refuses_prompts_without_them(world, tmp_path):
    from r3_env.data import write_jsonl
    from r3_env.train.ppo import PPOTrainer

    rows = [item.to_json() for item in world["items"][:3]]
    for row in rows:  # a copy: the module's items keep their gold ids
        row["metadata"] = {k: v for k, v in row["metadata"].items() if k != "supporting_passage_ids"}
    write_jsonl(tmp_path / "no_gold.jsonl", rows)
    gold_reward = dataclasses.replace(world["rollout"].reward, scheme="r3_gold")
    rollout = dataclasses.replace(world["rollout"], reward=gold_reward)
    run = RunConfig(out=str(tmp_path / "run"), seed=3, device="cpu")
    for prompts, refused in ((tmp_path / "no_gold.jsonl", True), (world["root"] / "world" / "train.jsonl", False)):
        config = PPOConfig(prompts=str(prompts), rollout_batch_size=2, n_samples_per_prompt=2, micro_batch_size=2,
                           train_batch_size=4)  # fmt: skip
        trainer = PPOTrainer(run, ModelConfig(policy=str(world["policy"])), config, rollout, str(world["policy"]))
        try:
            if refused:
                with pytest.raises(ValueError, match=r"r3_gold needs gold passage ids.*none of the 3 questions.*"
                                                     r"metadata\.supporting_passage_ids"):  # fmt: skip
                    trainer.load_prompts()
            else:
                trainer.load_prompts()
                assert trainer.items
        finally:
            trainer.close()


def script_one_right_one_wrong(trainer, world) -> None:
    """Two prompts, one answered right and one wrong by the scripted engine: the advantages differ."""
    trainer.load_prompts()
    trainer.items = world["items"][:2]
    right, wrong = trainer.items
    plans = {right.question: gold_plan(right), wrong.question: [answer_step("A guess.", "Nobody Atall")]}
    trainer.engine.script = Script(trainer.tokenizer, plans)


def test_lora_trains_only_its_adapters_and_saves_a_merged_policy(world, tmp_path):
    """``model.lora_rank``: peft adapters on the actor, none on the reference; the saved policy is plain HF."""
    from transformers import AutoModelForCausalLM

    from r3_env.train.models import save_policy

    lora = ModelConfig(policy=str(world["policy"]), lora_rank=4, target_modules="q_proj,v_proj")
    trainer = make_trainer(world, tmp_path, lora, init_kl_coef=0.01, estimator="reinforce")
    try:
        script_one_right_one_wrong(trainer, world)
        trainable = {n for n, p in trainer.actor.named_parameters() if p.requires_grad}
        assert trainable and all("lora_" in n for n in trainable)
        assert not any("lora_" in n for n, _ in trainer.reference.named_parameters())
        frozen = {n: p.detach().clone() for n, p in trainer.actor.named_parameters() if not p.requires_grad}
        lora_before = {n: p.detach().clone() for n, p in trainer.actor.named_parameters() if p.requires_grad}
        values = trainer.step()
        assert math.isfinite(values["policy_loss"]) and values["actor_trained"] == 1.0
        after = dict(trainer.actor.named_parameters())
        assert all(torch.equal(after[n], p) for n, p in frozen.items())
        assert any(not torch.equal(after[n], p) for n, p in lora_before.items())
        folder = save_policy(trainer.actor.model, trainer.tokenizer, tmp_path / "merged")
        assert not (folder / "adapter_config.json").exists()
        merged = AutoModelForCausalLM.from_pretrained(folder)
        base = AutoModelForCausalLM.from_pretrained(world["policy"])
        assert not torch.equal(
            merged.model.layers[0].self_attn.q_proj.weight, base.model.layers[0].self_attn.q_proj.weight
        )
        assert any("lora_" in n for n, _ in trainer.actor.named_parameters())  # the model in training keeps them
    finally:
        trainer.close()
    with pytest.raises(ValueError, match="lora_rank"):
        ModelConfig(policy="p", lora_rank=-1)


def test_bf16_autocast_warns_on_a_cpu_without_native_bf16(monkeypatch, caplog):
    """The CPU's bf16 support is stood in for (the test machine has one kind of CPU); autocast itself is real."""
    from r3_env.train import models

    for native, warned in ((False, True), (True, False)):
        monkeypatch.setattr(models, "native_cpu_bf16", lambda native=native: native)
        caplog.clear()
        layer = torch.nn.Linear(4, 4)
        models.autocast_bf16(layer)
        assert layer(torch.ones(1, 4)).dtype == torch.bfloat16
        assert ("no native bf16" in caplog.text) is warned and ("model.mixed_precision no" in caplog.text) is warned


def test_mixed_precision_auto_chooses_bf16_only_where_the_hardware_computes_it(monkeypatch, caplog):
    """The CPU's bf16 support is stood in for, as above; ``auto``'s choice on the real CPU is what the demo test
    reads from the trainer's log."""
    from r3_env.train import models

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for native in (False, True):
        monkeypatch.setattr(models, "native_cpu_bf16", lambda native=native: native)
        caplog.clear()
        with caplog.at_level("INFO", logger=models.__name__):
            assert models.autocast_in_bf16("auto", cpu) is native
        assert f"model.mixed_precision auto: {'bf16' if native else 'no (fp32)'}" in caplog.text
        assert models.autocast_in_bf16("auto", cuda) and models.autocast_in_bf16("bf16", cpu)
        assert not models.autocast_in_bf16("no", cuda)


def test_the_last_layers_train_under_bf16_autocast_and_the_rest_stay_frozen(world, tmp_path):
    """``model.trainable_layers`` and ``model.mixed_precision bf16``: a PPO step changes only the last layer and the
    final norm, the actor computes in bf16 while its weights and log-probs stay fp32, the reference computes in bf16.
    """
    settings = ModelConfig(policy=str(world["policy"]), trainable_layers=1, mixed_precision="bf16")
    trainer = make_trainer(world, tmp_path, settings, init_kl_coef=0.01, estimator="reinforce")
    try:
        script_one_right_one_wrong(trainer, world)
        layers = len(trainer.actor.model.model.layers)
        last = f"model.layers.{layers - 1}."
        trainable = {n for n, p in trainer.actor.model.named_parameters() if p.requires_grad}
        assert trainable and all(n.startswith(last) or n == "model.norm.weight" for n in trainable)
        assert all(p.dtype == torch.float32 for p in trainer.actor.parameters())
        ids = torch.tensor([[1, 2, 3, 4]])
        log_probs = trainer.actor(ids, attention_mask=torch.ones_like(ids), return_logprobs=True)
        assert log_probs.dtype == torch.float32
        with torch.no_grad():
            assert trainer.reference.model(ids).logits.dtype == torch.bfloat16
        before = {n: p.detach().clone() for n, p in trainer.actor.model.named_parameters()}
        values = trainer.step()
        assert math.isfinite(values["policy_loss"]) and values["actor_trained"] == 1.0
        after = dict(trainer.actor.model.named_parameters())
        assert all(torch.equal(after[n], p) for n, p in before.items() if n not in trainable)
        assert any(not torch.equal(after[n], before[n]) for n in trainable)
    finally:
        trainer.close()
    with pytest.raises(ValueError, match="choose one way"):
        ModelConfig(policy="p", trainable_layers=2, lora_rank=4)
    with pytest.raises(ValueError, match="more than the model's"):
        from r3_env.train.models import freeze_below

        freeze_below(trainer.actor.model, layers + 1)


def test_train_local_refuses_a_rerun_with_other_settings(world, tmp_path):
    from r3_env.train.local import LocalTrainConfig, check_config

    def config(**ppo):
        return LocalTrainConfig(
            RunConfig(out=str(tmp_path)), ModelConfig(policy="p"), SFTConfig(), PPOConfig(**ppo), world["rollout"]
        )

    check_config(tmp_path, config(iterations=3))
    check_config(tmp_path, config(iterations=3, generate_batch=8))  # speed settings may change on resume
    with pytest.raises(ConfigError, match=r"ppo\.iterations"):
        check_config(tmp_path, config(iterations=4))
    # a run recorded before a setting existed resumes while that setting keeps its default
    record = json.loads((tmp_path / "config.json").read_text())
    del record["ppo"]["eps_clip_high"], record["model"]["lora_rank"]
    (tmp_path / "config.json").write_text(json.dumps(record))
    check_config(tmp_path, config(iterations=3))
    record = json.loads((tmp_path / "config.json").read_text())
    del record["ppo"]["eps_clip_high"]
    (tmp_path / "config.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=r"ppo\.eps_clip_high"):
        check_config(tmp_path, config(iterations=3, eps_clip_high=0.28))


def test_dotted_settings_change_a_config_typed_as_the_flags_are(world, tmp_path):
    from r3_env.train.local import LocalTrainConfig

    base = LocalTrainConfig(
        RunConfig(out=str(tmp_path)), ModelConfig(policy="p"), SFTConfig(), PPOConfig(), world["rollout"]
    )
    changed = base.with_settings({"ppo.actor_lr": "1e-5", "ppo.critic_warmup": "2", "out": str(tmp_path / "b")})
    assert changed.ppo.actor_lr == 1e-5 and changed.ppo.critic_warmup == 2 and changed.run.out == str(tmp_path / "b")
    assert changed.ppo.temperature == base.ppo.temperature and changed.rollout == base.rollout
    assert base.ppo.actor_lr == PPOConfig().actor_lr  # the original is left as it was
    assert base.with_settings({"env.topk": "7"}).rollout.env.topk == 7  # the rollout's sections too
    with pytest.raises(ConfigError, match=r"ppo\.actor_rate: no such setting.*SECTION one of model, sft, ppo"):
        base.with_settings({"ppo.actor_rate": "1"})
    with pytest.raises(ConfigError, match=r"actor_lr must be float, got 'fast'"):
        base.with_settings({"ppo.actor_lr": "fast"})
    with pytest.raises(ConfigError, match="learning rates.*must be positive"):
        base.with_settings({"ppo.actor_lr": "-1"})


def test_cli_errors_name_the_setting_and_the_fix(world, tmp_path):
    from conftest import run_r3rag

    missing = run_r3rag("train", "local", "--out", str(tmp_path / "run"), "--ppo.prompts", "x.jsonl")
    assert missing.returncode == 2 and "model.policy is required" in missing.stderr
    nothing = run_r3rag("train", "local", "--out", str(tmp_path / "run"), "--model.policy", str(world["policy"]))
    assert nothing.returncode == 2 and "nothing to train" in nothing.stderr
    bad = run_r3rag("train", "model", "--world", str(world["root"] / "world"), "--out", str(tmp_path / "m"),
                    "--hidden_size", "30", "--heads", "4")  # fmt: skip
    assert bad.returncode == 2 and "hidden_size (30) must divide by heads (4)" in bad.stderr
    built = run_r3rag("train", "model", "--world", str(world["root"] / "world"), "--out", str(tmp_path / "m"),
                      "--vocab_size", "400", "--hidden_size", "16", "--heads", "2", "--kv_heads", "1")  # fmt: skip
    assert built.returncode == 0 and (tmp_path / "m" / "factory.json").is_file(), built.stderr[-2000:]


# -- rollouts from a vLLM server ------------------------------------------------------------------------


def test_the_vllm_rollout_engine_names_what_is_missing(world, tmp_path):
    """The retrieval service stands in for servers that are not what the engine needs: a real HTTP server that
    serves no model and lacks vLLM's dev endpoints. A tied served model is refused before any reload."""

    async def attempts() -> None:
        engine = VLLMServerEngine(world["rollout"].services.retriever_url, retries=0)
        try:
            with pytest.raises(VLLMServerError, match="lists no served model.*vLLM server"):
                await engine.served_model()
            engine.model, engine.served_from = "policy", str(world["policy"])  # as /v1/models names a served folder
            with pytest.raises(VLLMServerError, match="tied to its input embedding.*untied=True"):
                await engine.reload(world["policy"])
            engine.served_from = str(tmp_path)  # a folder without a config: whether it is tied cannot be told
            with pytest.raises(VLLMServerError, match="cannot read the config.*untied=True"):
                await engine.reload(world["policy"])
            engine.checked_untied = True  # past that check: a server without VLLM_SERVER_DEV_MODE answers 404
            with pytest.raises(VLLMServerError, match="VLLM_SERVER_DEV_MODE=1"):
                await engine.reload(world["policy"])
        finally:
            await engine.aclose()

    asyncio.run(attempts())


def token_logprobs(folder, prompt: list[int], tokens: list[int]) -> list[float]:
    """HF's log-probabilities of ``tokens`` after ``prompt`` under the weights in ``folder``."""
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    return logits.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ppo_rollouts_from_a_vllm_server_follow_the_actors_weights(world, tmp_path):
    """vLLM's CPU build (``.venv-vllm``) serves the policy (untied); a reload swaps its weights in place, and two
    PPO iterations generate there, the actor saved and reloaded before each. The served weights are checked by the
    log-probabilities vLLM reports for its own tokens against HF's under the same weights."""
    vllm_python = ROOT / ".venv-vllm" / "bin" / "python"
    if not vllm_python.exists():
        pytest.skip("no .venv-vllm: run `bash scripts/setup_vllm.sh` (vLLM's CPU build, about 100 s, 3.7 GB)")
    sizes = dataclasses.replace(TINY, hidden_size=128)  # head size 64, the only one vLLM's CPU build runs
    policy = build_tiny_policy(world["root"] / "world", tmp_path / "policy0", sizes)
    other = build_tiny_policy(world["root"] / "world", tmp_path / "other", dataclasses.replace(sizes, seed=1))
    tokenizer = load_tokenizer(str(policy))
    untied = [
        save_policy(
            AutoModelForCausalLM.from_pretrained(folder), tokenizer, tmp_path / f"{folder.name}_untied", untied=True
        )
        for folder in (policy, other)
    ]
    ids = tokenizer(world["items"][0].question)["input_ids"]
    greedy = SamplingParams(temperature=0.0, max_tokens=8, logprobs=1)

    with VLLMServer(str(vllm_python), str(untied[0]), log=tmp_path / "vllm.log", reloadable=True) as server:

        async def served(folder_to_load=None) -> tuple[list[int], list[float]]:
            engine = VLLMServerEngine(server.url)
            try:
                if folder_to_load is not None:
                    await engine.reload(folder_to_load)
                output = (await engine.generate(ids, greedy)).outputs[0]
            finally:
                await engine.aclose()
            return output.token_ids, [next(iter(step.values())).logprob for step in output.logprobs]

        tokens, logprobs = asyncio.run(served())
        assert tokens and logprobs == pytest.approx(token_logprobs(policy, ids, tokens), abs=1e-3)
        tokens, logprobs = asyncio.run(served(untied[1]))
        assert logprobs == pytest.approx(token_logprobs(other, ids, tokens), abs=1e-3)
        assert logprobs != pytest.approx(token_logprobs(policy, ids, tokens), abs=1e-3)  # the reload took

        trainer = make_trainer({**world, "policy": policy}, tmp_path, vllm_url=server.url, actor_lr=1e-3)
        try:
            trainer.load_prompts()
            first, second = trainer.step(), trainer.step()
        finally:
            trainer.close()
        for values in (first, second):
            assert values["episodes"] == 4 and values["response_tokens"] > 0
            assert values["sync_s"] > 0 and values["generation_s"] > 0  # each rollout after a reload
        synced = tmp_path / "run" / "ppo" / "rollout_policy"  # the actor after the first update
        assert token_logprobs(synced, ids, tokens) != pytest.approx(token_logprobs(policy, ids, tokens), abs=1e-3)
        tokens, logprobs = asyncio.run(served())
        assert logprobs == pytest.approx(token_logprobs(synced, ids, tokens), abs=1e-3)


# -- health monitoring and the best policy ----------------------------------------------------------------


def test_a_collapsing_run_warns_and_keeps_the_best_policy_by_dev_reward(world, tmp_path, caplog):
    """Scripted steps drive the policy through phases, by the iterations done: a wrong guess, one hop then a
    wrong guess, the gold plan twice, then a collapse like the no-answer ablation's (one question searched with
    the question itself until the steps run out, the other a blank query). Real PPO updates (a high learning
    rate) run throughout; the run is interrupted after iteration 5's rollouts and resumed from its checkpoint.
    The monitor's shares warn in the log and ``ppo/health.jsonl`` from the collapse on, never before it, and
    ``ppo/best_policy`` holds the actor of the iteration with the highest dev reward."""
    import logging

    from eval.report_training import training_charts, training_html, training_markdown
    from r3_env.train.health import read_health
    from r3_env.train.metrics import MetricsLog, read_metrics

    train_items, dev_items = world["items"][:2], world["items"][2:4]
    for name, items in (("train.jsonl", train_items), ("dev.jsonl", dev_items)):
        (tmp_path / name).write_text("".join(json.dumps(item.to_json()) + "\n" for item in items))
    blank = query_step("I need it.", "QUERYSLOT").replace("QUERYSLOT", " ")

    def phase(item, done: int, searched: bool) -> list[str]:
        if done == 0:
            return [answer_step("A guess.", "Nobody Atall")]
        if done == 1:
            return gold_plan(item)[:1] + [answer_step("A guess.", "Nobody Atall")]
        if done < 4:
            return gold_plan(item)
        return [query_step("I search the question.", item.question)] if searched else [blank]

    env = dataclasses.replace(world["rollout"].env, max_steps=3, max_step_tokens=160)
    rollout = dataclasses.replace(world["rollout"], env=env)
    snapshots: dict[int, dict[str, torch.Tensor]] = {}

    class Recorder(MetricsLog):
        """The metrics log, a copy of the actor at each logged iteration, and an interruption after iteration 5."""

        crash = True

        def log(self, stage, step, values):
            super().log(stage, step, values)
            snapshots[step] = {k: v.detach().clone() for k, v in trainer.actor.model.state_dict().items()}
            if step == 5 and Recorder.crash:
                Recorder.crash = False
                raise KeyboardInterrupt

    def build():
        from r3_env.train.ppo import PPOTrainer

        config = PPOConfig(prompts=str(tmp_path / "train.jsonl"), iterations=6, rollout_batch_size=2,
                           n_samples_per_prompt=2, micro_batch_size=2, train_batch_size=4, max_len=2048,
                           actor_lr=5e-3, eval_prompts=str(tmp_path / "dev.jsonl"), eval_every=1)  # fmt: skip
        run = RunConfig(out=str(tmp_path / "run"), seed=3, device="cpu", save_every=1)
        metrics, health = Recorder(tmp_path / "run", tensorboard=False), HealthConfig(share_floor=0.2)
        trainer = PPOTrainer(run, ModelConfig(policy=str(world["policy"])), config, rollout, str(world["policy"]),
                             metrics, health=health)  # fmt: skip
        plans = {
            item.question: [phase(item, done, item is not train_items[1]) for done in range(7)]
            for item in train_items + dev_items
        }
        scripts = [Script(trainer.tokenizer, {q: p[done] for q, p in plans.items()}) for done in range(7)]
        trainer.engine.script = lambda prompt: scripts[trainer.iteration](prompt)
        return trainer

    caplog.set_level(logging.WARNING, logger="r3_env.train.health")
    trainer = build()
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.train()
    finally:
        trainer.metrics.close()
        trainer.close()
    trainer = build()
    try:
        trainer.train()
        assert trainer.best is not None
    finally:
        trainer.metrics.close()
        trainer.close()

    assert not (tmp_path / "run" / "ppo" / "checkpoint.pt").exists()  # resumed from above, superseded by the policy
    rows = [row for row in read_metrics(tmp_path / "run") if row["stage"] == "ppo"]
    dev = {row["step"]: row["dev_reward"] for row in rows}
    assert sorted(dev) == list(range(7))
    best_iteration = max(dev, key=lambda step: (dev[step], -step))  # the first of the highest
    folder = tmp_path / "run" / "ppo" / "best_policy"
    best = json.loads((folder / "best.json").read_text())
    assert best == {"iteration": best_iteration, "dev_reward": pytest.approx(dev[best_iteration])}
    assert 0 < best_iteration < 5 and dev[6] < dev[best_iteration]  # the collapse is not kept
    kept = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    assert all(torch.equal(kept[k], v) for k, v in snapshots[best_iteration].items() if k in kept)
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "ppo" / "policy").state_dict()
    assert any(not torch.equal(kept[k], final[k]) for k in kept)

    by_step = {row["step"]: row for row in rows}
    assert by_step[6]["no_answer"] == 0.5 and by_step[6]["format_error"] == 0.5
    assert by_step[6]["copied_queries"] == 1.0 and by_step[6]["repeated_queries"] == pytest.approx(2 / 3)
    assert by_step[6]["blank_queries"] == pytest.approx(2 / 8)
    assert by_step[4]["no_answer"] == by_step[4]["copied_queries"] == by_step[4]["blank_queries"] == 0.0

    health = read_health(tmp_path / "run" / "ppo")
    assert [row["iteration"] for row in health] == [1, 2, 3, 4, 5, 6]
    signs = {row["iteration"]: {w["sign"] for w in row["warnings"]} for row in health}
    rising = {f"{name} rising" for name in ("no_answer", "format_error", "blank_queries", "repeated_queries",
                                            "copied_queries")}  # fmt: skip
    assert rising <= signs[5] and rising <= signs[6]
    assert not any(sign.endswith("rising") for i in (1, 2, 3, 4) for sign in signs[i] - {"retrievals rising"})
    # searches per episode drift from iteration 4: the scripted policy learns to search (0, 1, then 2 an episode
    # against a baseline of 1). The drift sign reports a change in behaviour, for the better or the worse.
    assert [row["values"]["retrievals"] for row in health] == [0.0, 1.0, 2.0, 2.0, 1.5, 1.5]
    assert [i for i in signs if "retrievals rising" in signs[i]] == [4, 5, 6]
    assert health[4]["baselines"]["no_answer"] == 0.0  # the resumed monitor kept its first iterations' baseline
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        line.startswith("PPO health, iteration 5: unanswered episodes rising: no_answer 0.500, baseline 0.000")
        for line in lines
    )
    assert sum("iteration 6: queries copying the question rising" in line for line in lines) == 1

    charts = training_charts(tmp_path / "run")
    health_charts = {chart["title"]: chart for chart in charts if chart["group"] == "health"}
    queries = health_charts["Blank, repeated and copied queries"]
    assert queries["series"]["copies the question"][-1] == [6, 1.0]
    assert {w["sign"] for w in queries["warnings"]} >= {"copied_queries rising", "repeated_queries rising"}
    markdown = "\n".join(training_markdown(charts))
    assert f"Best policy (ppo/best_policy): PPO iteration {best_iteration}" in markdown
    assert "| 5 | no_answer rising | unanswered episodes | 50.0% | 0.0% | 20.0% |" in markdown
    page = training_html(charts)
    assert 'id="health-plots"' in page and 'id="health-warnings"' in page and 'id="best-policy"' in page
