"""Algorithm 1 with a small teacher: SmolLM2-135M-Instruct behind vLLM's CPU server, zero-shot and few-shot.

    python bench/smollm2_teacher.py [--questions 100] [--samples 2] [--shots 0,2] [--out bench_out/smollm2_teacher]

On the demo's synthetic world (1,000 entities, BM25, the demo's episode rules), the scripted teacher
writes a few train questions' trajectories; those are the few-shot examples (``--teacher.few_shot``).
SmolLM2 (``r3rag model get``) is served by vLLM's OpenAI-compatible server from .venv-vllm
(``bash scripts/setup_vllm.sh``) and writes the trajectories of ``--questions`` other train questions,
``--samples`` each at Algorithm 1's temperatures, through ``r3rag coldstart synth``. Prints, per
number of shots, the acceptance rate (questions with a correct trajectory), the outcome shares of
the samples, the steps of the kept trajectories and the teacher's speed. Rerun to resume.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from demo.services import ServiceProcess, VLLMServer  # noqa: E402
from demo.settings import ENV  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--shots", default="0,2", help="few-shot example counts to compare (0: zero-shot)")
    parser.add_argument("--vllm_python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--out", default="bench_out/smollm2_teacher")
    args = parser.parse_args()
    if not Path(args.vllm_python).is_file():
        sys.exit(f"{args.vllm_python} is missing: run `bash scripts/setup_vllm.sh` (vLLM's CPU build)")

    import yaml

    from r3_env.coldstart.synth import SynthConfig, synthesize
    from r3_env.coldstart.teacher import TeacherConfig
    from r3_env.data import read_dataset, write_dataset
    from r3_env.env import EnvConfig
    from r3_env.model_registry import get_model
    from r3_env.retrieval.index_builder import IndexBuildConfig, build_index
    from r3_env.runs import RetrievalSource
    from r3_env.world.build import WorldConfig, generate_world

    out = Path(args.out)
    shots = [int(s) for s in args.shots.split(",")]
    generate_world(WorldConfig(entities=1000, seed=0), out / "world")
    index = build_index(IndexBuildConfig(corpus_path=str(out / "world" / "corpus.jsonl"), save_dir=str(out / "idx")))
    (out / "retriever.yaml").write_text(yaml.safe_dump({"retrieval_method": "bm25", "index_path": str(index)}))
    train = read_dataset(out / "world" / "train.jsonl")
    write_dataset(out / "examples_questions.jsonl", train[:16])
    write_dataset(out / "asked.jsonl", train[100 : 100 + args.questions])
    model = get_model("smollm2-135m-instruct", out / "smollm2")
    env = EnvConfig(**ENV)
    with ServiceProcess(["retriever", "serve", "--config", str(out / "retriever.yaml")]) as retriever:
        retrieval = RetrievalSource(url=retriever.url)
        examples = SynthConfig(data=str(out / "examples_questions.jsonl"), out=str(out / "examples"), samples=1)
        asyncio.run(synthesize(examples, env, TeacherConfig(kind="scripted"), retrieval))
        results = {}
        with VLLMServer(args.vllm_python, str(model), log=out / "vllm.log") as server:
            for count in shots:
                few_shot = {"few_shot": str(out / "examples" / "trajectories.jsonl"), "few_shot_count": count}
                teacher = TeacherConfig(kind="openai", base_url=server.base_url, model=str(model), max_tokens=96,
                                        **(few_shot if count else {}))  # fmt: skip
                config = SynthConfig(data=str(out / "asked.jsonl"), out=str(out / f"shots{count}"),
                                     samples=args.samples, concurrency=16)  # fmt: skip
                started = time.perf_counter()
                summary, stats = asyncio.run(synthesize(config, env, teacher, retrieval))
                (dataset,) = summary["datasets"].values()
                results[count] = {**dataset, "wall_s": time.perf_counter() - started, "resumed": stats.skipped > 0}
    (out / "smollm2_teacher.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nSmolLM2-135M-Instruct as Algorithm 1's teacher: {args.questions} world train questions x "
          f"{args.samples} samples (temperatures 0.8, 0.6, ...), BM25, the demo's episode rules")  # fmt: skip
    print(f"{'shots':>6}{'accepted':>10}{'correct':>9}{'wrong':>8}{'no answer':>11}{'format err':>12}"
          f"{'steps kept':>12}{'prompt tok/req':>16}{'out tok/s':>11}")  # fmt: skip
    for count, d in results.items():
        shares = {k: v / d["samples"] for k, v in d["outcomes"].items()}
        rate = float("nan") if d["resumed"] else d["completion_tokens"] / d["wall_s"]
        print(f"{count:>6}{d['acceptance_rate']:>10.1%}{shares.get('correct', 0):>9.1%}{shares.get('wrong', 0):>8.1%}"
              f"{shares.get('no_answer', 0):>11.1%}{shares.get('format_error', 0):>12.1%}{d['mean_steps_kept']:>12.2f}"
              f"{d['prompt_tokens'] / max(d['requests'], 1):>16.0f}{rate:>11.1f}")  # fmt: skip
    print("(out tok/s: completion tokens over the run's wall time; nan for a run that resumed earlier samples)")


if __name__ == "__main__":
    main()
