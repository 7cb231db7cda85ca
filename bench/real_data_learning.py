"""Does a small real model learn step-by-step retrieval on real questions it never saw?

    python bench/real_data_learning.py [--data ../shared/data] [--model smollm2-135m-instruct] [--lora_rank -1]
        [--eval_engine vllm] [--baselines] [--transfer POLICY] [--ppo_actor_lrs 1e-4] [--quick]
        [--out bench_out/real_data_learning]

Runs ``r3rag demo --data DATA`` into OUT/demo (a rerun resumes): one BM25 index over the union of the
samples' paragraphs, the fixed split by question id (``r3_env.real_data``), the evidence teacher's
cold start on the train part, SFT, RL under the real-question recipe's settings (``REAL.rl`` in
demo/settings.py), and evaluations of the untrained (zero-shot), SFT and RL policies on the eval part. Then, on
the same eval questions:

- single-shot BM25 at the same number of documents: the question as the one query, top-K with K
  the PPO policy's mean unique documents per dataset (rounded), read by the untrained model
  (naive RAG at matched K);
- the evidence-chain oracle: the evidence teacher on the eval part, each annotated hop one query
  (retrieval's upper bound; it knows the answer, so it has no EM or F1);
- ``--baselines`` (issue 13's table): CoT without retrieval, naive RAG top-5 and top-16, all with
  the untrained model; ``--transfer POLICY``: a policy trained elsewhere (the synthetic world's
  SFT+PPO checkpoint) in the r3 format;
- ``--ppo_actor_lrs 1e-4,...``: PPO again from the same SFT policy with each other actor learning
  rate, everything else the demo's (OUT/demo/train_ppo_lrX), evaluated the same way.

Prints EM, F1, Full-Recall and unique documents read per dataset (in %, documents as a count), and
writes OUT/real_data_learning.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from demo.run import Demo, DemoConfig  # noqa: E402
from r3_env.real_data import SHARED_DATA  # noqa: E402

# R3-RAG (Qwen2.5-7B, E5 over Wikipedia 2018, full dev sets), docs/recipes/r3-rag.md#the-papers-figures:
# ACC / F1 / EM.
PAPER = {"hotpotqa": (65.5, 59.7, 46.4), "2wikimultihopqa": (62.3, 62.7, 54.2), "musique": (33.6, 34.0, 21.4)}


def cells(scores: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each dataset's final EM, F1, Full-Recall and unique documents read."""
    return {
        name: {
            "em": data["final"]["em"],
            "f1": data["final"]["f1"],
            "full_recall": data["final"]["full_recall"],
            "docs": data["final"]["avg_docs"],
            "questions": data["questions"],
        }
        for name, data in scores["datasets"].items()
    }


def eval_files(demo: Demo) -> dict[str, Path]:
    """Each dataset's eval part, by name."""
    from r3_env.runs import dataset_names, dataset_paths

    files = dataset_paths(demo.data.eval)
    return dict(zip(dataset_names(files), files, strict=True))


def oracle(demo: Demo, retriever_url: str) -> dict[str, dict[str, float]]:
    """The evidence teacher on the eval part: retrieval's upper bound (its answers are the gold ones).

    Its samples are scored as evaluation rows (``eval.score.score_rows``), a question whose sample
    failed counting as missing, as in the policies' runs.
    """
    from eval.score import score_rows
    from r3_env.coldstart.synth import SynthConfig, synthesize
    from r3_env.coldstart.teacher import TeacherConfig
    from r3_env.data import iter_jsonl, read_dataset, read_label
    from r3_env.env import EnvConfig
    from r3_env.runs import RetrievalSource

    folder = demo.out / "oracle"
    files = eval_files(demo)
    config = SynthConfig(data=demo.data.eval, out=str(folder), samples=1, max_questions=demo.budget.eval_questions)
    asyncio.run(synthesize(config, EnvConfig(**demo.env), TeacherConfig(kind="evidence"),
                           RetrievalSource(url=retriever_url)))  # fmt: skip
    asked, gold = {}, {}
    for name, path in files.items():
        items = read_dataset(path)[: demo.budget.eval_questions or None]
        asked[name] = len(items)
        gold.update({(name, item.id): read_label(item.to_json()).gold_ids for item in items})
    rows = [
        {**row, "gold_ids": gold[(row["dataset"], row["question_id"])], "prediction": row.get("answer") or ""}
        for _, row in iter_jsonl(folder / "samples.jsonl")
    ]
    body, _ = score_rows(rows, [demo.env["max_steps"]], None, asked=asked)
    return {name: {**cell, "em": None, "f1": None} for name, cell in cells(body).items()}


def extra_rows(demo: Demo, args: argparse.Namespace, trained: dict[str, dict[str, float]]) -> dict[str, dict]:
    """The baselines beside the demo's policies, on the same eval questions, with the services started again."""
    from eval.metrics import matched_k

    rows: dict[str, dict] = {}
    base = demo.paths["policy0"]
    with demo.serving() as urls:
        matched = {}
        for name, path in eval_files(demo).items():
            k = matched_k(trained[name]["docs"])
            scores = demo.evaluate(f"single_shot_{name}", base, str(path), *urls, eval_method="naive_rag",
                                   naive_topk=k)  # fmt: skip
            matched[name] = {**cells(scores)[name], "k": k}
        rows["single-shot BM25 @K"] = matched
        if args.baselines:
            runs = {"CoT (no retrieval)": ("cot", "direct", {}),
                    "naive RAG top-5": ("naive_rag_5", "naive_rag", {"naive_topk": 5}),
                    "naive RAG top-16": ("naive_rag_16", "naive_rag", {"naive_topk": 16})}  # fmt: skip
            for label, (name, method, extra) in runs.items():
                rows[label] = cells(demo.evaluate(name, base, demo.data.eval, *urls, eval_method=method, **extra))
        if args.transfer:
            rows["transfer (world SFT+PPO)"] = cells(
                demo.evaluate("transfer", Path(args.transfer).resolve(), demo.data.eval, *urls)
            )
        for lr in [float(v) for v in args.ppo_actor_lrs.split(",") if v.strip()]:
            rows[f"SFT + PPO, actor lr {lr:g}"] = ppo_again(demo, lr, urls)
        rows["evidence-chain oracle"] = oracle(demo, urls[0])
    return rows


def ppo_again(demo: Demo, actor_lr: float, urls: tuple[str, str]) -> dict[str, dict[str, float]]:
    """PPO from the demo's SFT policy with another actor learning rate (the demo's other settings), evaluated."""
    name = f"ppo_lr{actor_lr:g}"
    policy = demo.ppo_again({"ppo.actor_lr": actor_lr}, demo.out / f"train_{name}", urls)
    return cells(demo.evaluate(name, policy, demo.data.eval, *urls))


def fmt(value: float | None, scale: float = 100.0, width: int = 7) -> str:
    return f"{'-':>{width}}" if value is None else f"{scale * value:>{width}.1f}"


def print_table(rows: dict[str, dict[str, dict]], datasets: list[str]) -> None:
    width = max(map(len, rows)) + 2
    print(f"{'':<{width}}" + "".join(f"{name:^29}" for name in datasets))
    print(f"{'':<{width}}" + f"{'EM':>7}{'F1':>7}{'Full':>8}{'docs':>7}" * len(datasets))
    for label, by_dataset in rows.items():
        line = f"{label:<{width}}"
        for name in datasets:
            c = by_dataset.get(name)
            if c is None:
                line += f"{'':>29}"
                continue
            line += fmt(c["em"]) + fmt(c["f1"]) + fmt(c["full_recall"], width=8) + fmt(c["docs"], 1.0)
        print(line)
    matched = rows.get("single-shot BM25 @K", {})
    if matched:
        print("single-shot K per dataset: " + ", ".join(f"{name} {c['k']}" for name, c in matched.items()))
    paper = ", ".join(f"{name} {acc}/{f1}/{em}" for name, (acc, f1, em) in PAPER.items())
    print(f"for scale, R3-RAG with Qwen2.5-7B (E5, Wikipedia, full dev sets) ACC/F1/EM: {paper}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(SHARED_DATA))
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--lora_rank", type=int, default=-1, help="as r3rag demo's (-1: the recipe's, 16)")
    parser.add_argument("--eval_engine", default="hf", choices=("hf", "vllm"))
    parser.add_argument("--vllm_python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--eval_questions", type=int, default=0, help="per dataset (0: the recipe's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baselines", action="store_true", help="CoT and naive RAG top-5/16 rows (issue 13)")
    parser.add_argument("--transfer", default="", help="a policy trained on the synthetic world, evaluated here")
    parser.add_argument("--ppo_actor_lrs", default="", help="PPO again from the SFT policy at these actor lrs")
    parser.add_argument("--quick", action="store_true", help="the --quick demo budget")
    parser.add_argument("--out", default="bench_out/real_data_learning")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    if not Path(args.data).is_dir():
        sys.exit(f"--data {args.data} is not there: point it at the shared samples (../shared/data)")
    out = Path(args.out)
    started = time.perf_counter()
    config = DemoConfig(out=str(out / "demo"), model=args.model, data=args.data, lora_rank=args.lora_rank,
                        seed=args.seed, quick=args.quick, eval_engine=args.eval_engine, vllm_python=args.vllm_python,
                        eval_questions=args.eval_questions)  # fmt: skip
    demo = Demo(config)
    demo.run()
    policies = {"zero-shot (untrained)": "untrained", "SFT": "sft", "SFT + PPO": "ppo"}
    trained = {label: cells(json.loads((demo.paths[f"eval_{name}"] / "scores.json").read_text()))
               for label, name in policies.items()}  # fmt: skip
    rows = extra_rows(demo, args, trained["SFT + PPO"])
    table = {"single-shot BM25 @K": rows.pop("single-shot BM25 @K"), **trained, **rows}
    (out / "real_data_learning.json").write_text(json.dumps(table, indent=2) + "\n")
    datasets = list(trained["SFT"])
    asked = demo.budget.eval_questions or "every"
    print(f"\n{asked} eval questions per dataset; {time.perf_counter() - started:.0f} s\n")
    print_table(table, datasets)


if __name__ == "__main__":
    main()
