"""Algorithm 2: SFT data from synthesised trajectories, read by OpenRLHF's own SFT dataset class.

The central check: the tokens of an SFT transcript equal the tokens the RL environment builds when
the policy takes the same steps, and the loss falls on the policy's steps, never on documents.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import runpy
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import CHATML_TEMPLATE, ROOT, Script, make_tokenizer, run_r3rag, save_tiny_causal_lm

from r3_env.coldstart.sft_data import SFTDataConfig, build_sft_data
from r3_env.coldstart.synth import SynthConfig, synthesize
from r3_env.coldstart.teacher import TeacherConfig
from r3_env.engines import HFEngine, SamplingParams
from r3_env.env import EnvConfig
from r3_env.protocol import ChatRenderer, Step, get_format
from r3_env.records import turns_of
from r3_env.retrieval import load_retriever
from r3_env.retrieval.client import AsyncInProcess
from r3_env.retrieval.index_builder import IndexBuildConfig, build_index
from r3_env.rollout import run_episode
from r3_env.rollout_config import RolloutConfig
from r3_env.rollout_context import RolloutContext
from r3_env.runs import RetrievalSource, retriever_config
from r3_env.train import openrlhf_cpu
from r3_env.world.build import WorldConfig, generate_world


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("sft")
    generate_world(WorldConfig(entities=200, seed=11, bm25_check=0), root / "world")
    index = build_index(IndexBuildConfig(corpus_path=str(root / "world" / "corpus.jsonl"), save_dir=str(root / "idx")))
    (root / "retriever.yaml").write_text(f"retrieval_method: bm25\nindex_path: {index}\n")
    config = SynthConfig(data=str(root / "world" / "train.jsonl"), out=str(root / "cs"), samples=1, max_questions=12)
    retrieval = RetrievalSource(config=str(root / "retriever.yaml"))
    asyncio.run(synthesize(config, EnvConfig(), TeacherConfig(detour_rate=0.5), retrieval))
    # the same questions with the question's own top 3 shown before the first step (env.question_docs)
    first = dataclasses.replace(config, out=str(root / "cs_question_first"))
    asyncio.run(synthesize(first, EnvConfig(question_docs=3), TeacherConfig(detour_rate=0.5), retrieval))
    trajectories = root / "cs" / "trajectories.jsonl"
    return {
        "root": root,
        "trajectories": trajectories,
        "question_first": root / "cs_question_first" / "trajectories.jsonl",
        "retrieval": retrieval,
    }


def openrlhf_sft_dataset(path, tokenizer, **data):
    """OpenRLHF's SFTDataset over a JSONL file (``strategy`` only carries the ``--data.*`` arguments)."""
    from datasets import load_dataset
    from openrlhf.datasets import SFTDataset

    args = SimpleNamespace(data=SimpleNamespace(tokenizer_chat_template=None, apply_chat_template=True, **data))
    dataset = load_dataset("json", data_files=str(path), split="train")
    return SFTDataset(
        dataset, tokenizer, 4096, SimpleNamespace(args=args), num_processors=1, multiturn=data.get("multiturn", False)
    )


@pytest.fixture(scope="module", params=["chatml-bpe", "smollm2"])
def policy(request, bpe_backend, smollm2_tokenizer, tmp_path_factory):
    tokenizer = smollm2_tokenizer if request.param == "smollm2" else make_tokenizer(bpe_backend, CHATML_TEMPLATE)
    folder = save_tiny_causal_lm(tmp_path_factory.mktemp(request.param), tokenizer)
    return request.param, folder, tokenizer


@pytest.mark.parametrize("question_docs", [0, 3])
def test_sft_transcript_tokens_equal_the_rl_environment_tokens(synthesized, policy, tmp_path, question_docs):
    """With ``env.question_docs`` too: the documents shown with the question are in both, and never trained on."""
    from transformers import AutoModelForCausalLM

    name, folder, tokenizer = policy
    out = tmp_path / "sft.jsonl"
    source = synthesized["question_first" if question_docs else "trajectories"]
    stats = build_sft_data(SFTDataConfig(input=str(source), out=str(out), tokenizer=str(folder)))
    trajectories = [json.loads(line) for line in source.read_text().splitlines()]
    assert all(bool(row.get("question_documents")) == bool(question_docs) for row in trajectories)
    assert stats["examples"] == stats["trajectories"] == len(trajectories) >= 10
    dataset = openrlhf_sft_dataset(out, tokenizer, input_key="messages", output_key=None, multiturn=True)
    assert len(dataset) == len(trajectories)

    # the RL side: the same steps forced through a real (tiny) policy, documents from the same BM25 index
    script = Script(tokenizer)
    renderer = ChatRenderer(tokenizer)
    for row in trajectories:
        script.plans[row["question"]] = [renderer.format.render_step(t.step) for t in turns_of(row)]

    async def rollouts():
        retriever = AsyncInProcess(load_retriever(retriever_config(synthesized["retrieval"].config)))
        values = {"reward": {"scheme": "outcome"}, "env": {"question_docs": question_docs}}
        ctx = RolloutContext(RolloutConfig.from_dict(values), tokenizer, search=retriever)
        engine = HFEngine(AutoModelForCausalLM.from_pretrained(folder), tokenizer, script=script)
        params = SamplingParams(temperature=1.0, max_tokens=None)
        results = await asyncio.gather(
            *(
                run_episode(ctx, engine, r["question"], json.dumps(r["golden_answers"]), params, 4096)
                for r in trajectories
            )
        )
        await ctx.aclose()
        return results

    results = asyncio.run(rollouts())
    observation_open = renderer.frame.observation_open
    for index, (row, result) in enumerate(zip(trajectories, results, strict=True)):
        assert result.outcome == "correct", (name, row["id"])
        input_ids, _, loss_mask = dataset[index]
        assert input_ids[0].tolist() == result.observation_tokens, (name, row["id"])
        # position j's loss trains token j + 1 (OpenRLHF shifts labels; the last position has no next token)
        trained = {j + 1 for j in range(loss_mask.shape[1] - 1) if loss_mask[0, j] > 0}
        actions = {j for start, end in result.action_ranges for j in range(start, end)}
        assert actions <= trained  # every step token is trained on ...
        extra = sorted(trained - actions)  # ... besides the template's text after a turn end, never documents
        assert all(observation_open.startswith(tokenizer.decode([result.observation_tokens[j]])) for j in extra)
        assert len(extra) <= len(result.action_ranges)
        if question_docs:  # retrieved with the question again by the RL side: the same documents, in the prompt
            prompt = tokenizer.decode(result.observation_tokens[: result.action_ranges[0][0]])
            assert result.record["question_doc_ids"] == [d["id"] for d in row["question_documents"]]
            assert all(d["contents"].split("\n")[0] in prompt for d in row["question_documents"])


def test_per_step_form_is_the_papers_examples_and_loads_in_openrlhf(synthesized, smollm2_tokenizer, tmp_path):
    folder = tmp_path / "tok"
    smollm2_tokenizer.save_pretrained(folder)
    out = tmp_path / "per_step.jsonl"
    config = SFTDataConfig(input=str(synthesized["trajectories"]), out=str(out), form="per_step", tokenizer=str(folder))
    stats = build_sft_data(config)
    trajectories = [json.loads(line) for line in synthesized["trajectories"].read_text().splitlines()]
    assert stats["examples"] == sum(len(row["steps"]) for row in trajectories)
    dataset = openrlhf_sft_dataset(out, smollm2_tokenizer, input_key="prompt", output_key="response")
    renderer = ChatRenderer(smollm2_tokenizer)
    steps = [t.step for row in trajectories for t in turns_of(row)]
    assert len(dataset) == len(steps)
    for index, step in enumerate(steps):
        input_ids, _, loss_mask = dataset[index]
        trained = [input_ids[0, j + 1].item() for j in range(loss_mask.shape[1] - 1) if loss_mask[0, j] > 0]
        assert smollm2_tokenizer.decode(trained) == renderer.step(step)  # the output is the current step only


def test_sft_data_round_trips_through_the_protocol(synthesized, tmp_path):
    out = tmp_path / "sft.jsonl"
    result = run_r3rag("coldstart", "sft-data", "--input", str(synthesized["trajectories"]), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "--data.input_key messages --data.apply_chat_template --data.multiturn" in result.stdout
    fmt = get_format("r3")
    trajectories = [json.loads(line) for line in synthesized["trajectories"].read_text().splitlines()]
    detours = 0
    for row, example in zip(trajectories, map(json.loads, out.read_text().splitlines()), strict=True):
        turns = turns_of(row)
        messages = example["messages"]
        assert messages[0]["content"] == fmt.system_prompt() and fmt.find_question(messages[1]["content"])
        steps = [fmt.parse_step(m["content"]) for m in messages if m["role"] == "assistant"]
        assert steps == [t.step for t in turns]
        shown = [fmt.parse_documents(m["content"]) for m in messages[2:] if m["role"] == "user"]
        assert [[d.title for d in docs] for docs in shown] == [[d.title for d in t.documents] for t in turns[:-1]]
        detours += turns[0].step.query == row["question"]
    assert detours >= 1  # the too-broad-then-split pattern is in the data


def test_malformed_trajectories_are_named_with_their_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "question": "Q?", "steps": [{"analysis": "x", "query": "q"}]}) + "\n")
    result = run_r3rag("coldstart", "sft-data", "--input", str(bad))
    assert result.returncode == 2 and "bad.jsonl:1: the last step has no final answer" in result.stderr
    bad.write_text(json.dumps({"id": "a", "question": "Q?", "steps": [{"query": "q"}]}) + "\n")
    result = run_r3rag("coldstart", "sft-data", "--input", str(bad))
    assert result.returncode == 2 and "bad.jsonl:1: step 1 is malformed" in result.stderr


def test_trajectories_meet_the_chosen_step_format_or_are_refused(synthesized, tmp_path):
    """Reflections fold into an r3 analysis; r3 trajectories lack the tags shapes' reflections, which is refused."""
    result = run_r3rag(
        "coldstart", "sft-data", "--input", str(synthesized["trajectories"]), "--step_format", "tags",
        "--out", str(tmp_path / "tags.jsonl"),
    )  # fmt: skip
    assert result.returncode == 2
    assert "step 2 does not fit the 'tags' format (missing_reflection" in result.stderr
    assert "synthesize them with --step_format tags" in result.stderr
    tags_row = {
        "id": "t",
        "question": "Where was the director of Silent Harbor born?",
        "steps": [
            {"analysis": "I need the director.", "query": "Silent Harbor director", "documents": [
                {"id": "1", "contents": "Silent Harbor\nDirected by Marta Kell."}]},
            {"analysis": "", "reflection": "Marta Kell was born in Oslo.", "answer": "Oslo"},
        ],
    }  # fmt: skip
    source = tmp_path / "tags_trajectories.jsonl"
    source.write_text(json.dumps(tags_row) + "\n")
    out = tmp_path / "r3.jsonl"
    result = run_r3rag("coldstart", "sft-data", "--input", str(source), "--out", str(out))
    assert result.returncode == 0, result.stderr
    last = json.loads(out.read_text())["messages"][-1]["content"]
    assert get_format("r3").parse_step(last) == Step("Marta Kell was born in Oslo.", answer="Oslo")


class Captured(Exception):
    def __init__(self, args) -> None:
        super().__init__("captured")
        self.namespace = args


def test_launch_script_runs_openrlhf_sft_with_the_papers_settings(monkeypatch, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text(CHATML_TEMPLATE)
    env = {**os.environ, "CHAT_TEMPLATE_FILE": str(template)}
    output = subprocess.run(
        ["bash", str(ROOT / "launch" / "sft_coldstart.sh"), "--dry-run"], env=env, capture_output=True, text=True
    )
    assert output.returncode == 0, output.stderr
    words = subprocess.run(["bash", "-c", f"printf '%s\\0' {output.stdout}"], capture_output=True, text=True).stdout
    words = words.split("\0")[:-1]  # NUL-separated: the chat template holds newlines
    assert words[:3] == ["deepspeed", "--num_gpus", "8"]
    flags = words[words.index("openrlhf.cli.train_sft") + 1 :]

    import openrlhf.utils

    openrlhf_cpu.enable()  # flash_attn's import surface on CPU

    def capture(args):
        raise Captured(args)

    monkeypatch.setattr(openrlhf.utils, "get_strategy", capture)
    monkeypatch.setattr(sys, "argv", ["train_sft", *flags])
    with pytest.raises(Captured) as caught:  # OpenRLHF's own parser and checks, run for real
        runpy.run_module("openrlhf.cli.train_sft", run_name="__main__")
    args = caught.value.namespace
    assert args.data.multiturn and args.data.apply_chat_template and args.data.input_key == "messages"
    assert args.data.tokenizer_chat_template == CHATML_TEMPLATE
    assert (args.ds.zero_stage, args.data.max_len, args.train.max_epochs) == (3, 4096, 3)
    assert (args.adam.lr, args.train.batch_size) == (7e-6, 16)
    llama = subprocess.run(
        ["bash", str(ROOT / "launch" / "sft_coldstart.sh"), "--dry-run"],
        env={**os.environ, "POLICY": "meta-llama/Llama-3.1-8B-Instruct"},
        capture_output=True,
        text=True,
    ).stdout
    assert "--adam.lr 1e-5" in llama and "--train.batch_size 8" in llama
