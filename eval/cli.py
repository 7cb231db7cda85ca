"""``r3rag eval run | score | report | sweep``: FlashRAG-compatible evaluation."""

from __future__ import annotations

import argparse

from r3_env.config import add_config_command, configs_from_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from eval.run import SECTIONS as RUN_SECTIONS
    from eval.score import SECTIONS as SCORE_SECTIONS
    from eval.sweep import SECTIONS as SWEEP_SECTIONS

    actions = subparsers.add_parser(
        "eval", help="evaluate the policy and baselines: run, score, report, sweep"
    ).add_subparsers(dest="eval_command", metavar="ACTION", required=True)
    add_config_command(
        actions,
        "run",
        RUN_SECTIONS,
        run_run,
        help="run a method over FlashRAG datasets (one JSON line per question; rerun to resume)",
        description="Writes run.json and predictions.jsonl into --out. Methods: r3 (the step-by-step policy), "
        "react, direct (CoT), naive_rag (top --naive_topk), rrt (R2AG's retrieval tree steered by the model in "
        "the multi_query format, --rrt_*, then a reader in --reader_format answers from its documents), "
        "single_shot (top --naive_topk with the question, no model: the tree's baseline at matched @K), "
        "flashrag:flare|selfask|iter_retgen|ircot. Engines: "
        "--engine.kind hf (transformers), vllm (offline, GPU) or openai (--engine.base_url). The paper's protocol "
        "is the default: greedy, --env.topk 5, --env.max_steps 5.",
    )
    add_config_command(
        actions,
        "score",
        SCORE_SECTIONS,
        run_score,
        help="EM, F1, sub-EM, judge ACC and retrieval metrics of a run, per dataset and step cutoff",
        description="Writes scores.json, question_scores.jsonl and (with --judge.url, the reward server) "
        "judgements.jsonl into the run folder.",
    )
    report = actions.add_parser(
        "report",
        help="tables, plots and a trajectory browser over scored runs",
        description="Finds every scored run under DIR and writes report.md, report.json and report.html.",
    )
    report.add_argument("dir", help="a folder of evaluation runs (or one run)")
    report.add_argument("--out", default="", help="where to write the report (default: DIR)")
    report.add_argument("--training", default="", help="a `r3rag train local` run folder: add its training curves")
    report.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="RUN",
        help="a run without retrieval (its folder under DIR, name or label) that the answer categories compare the "
        "other runs with; repeat for one per model (default: each run's model's run without retrieval, if one)",
    )
    report.set_defaults(func=run_report)
    add_config_command(
        actions,
        "sweep",
        SWEEP_SECTIONS,
        run_sweep,
        help="runs over top-k and retrievers (max steps come from one run's cutoffs), scored, then a report",
        description="One run per (retriever, top-k) into --out/NAME, each scored; then the report over --out.",
    )


def run_run(args: argparse.Namespace) -> int:
    import asyncio
    import sys

    from eval.run import SECTIONS, EvalAborted, format_stats, run_eval

    _no_model_for_single_shot(args)
    config, env, engine, generation, retrieval = configs_from_args(args, SECTIONS)
    try:
        stats = asyncio.run(run_eval(config, env, engine, generation, retrieval))
    except EvalAborted as error:
        print(f"r3rag eval run: {error}", file=sys.stderr)
        return 1
    print(format_stats(stats, config.out))
    if stats.failed:
        print(f"{stats.failed} questions failed ({stats.last_error}); rerun the same command to retry them")
        return 1
    return 0


def _no_model_for_single_shot(args: argparse.Namespace) -> None:
    """single_shot loads no model: without --engine.model (flag or file) run.json records the model as "none"."""
    from r3_env.config import load_yaml

    values = load_yaml(args.config) if getattr(args, "config", None) else {}
    method = getattr(args, "method", None) or values.get("method")
    if method == "single_shot" and not getattr(args, "engine.model", None):
        if not (values.get("engine") or {}).get("model"):
            setattr(args, "engine.model", "none")


def run_score(args: argparse.Namespace) -> int:
    import asyncio
    import sys

    from eval.score import SECTIONS, format_scores, score_run
    from r3_env.reward_client import RewardServiceError

    config, judge = configs_from_args(args, SECTIONS)
    try:
        scores = asyncio.run(score_run(config, judge))
    except RewardServiceError as error:
        print(
            f"r3rag eval score: the judge failed ({error}); verdicts so far are kept, rerun to go on", file=sys.stderr
        )
        return 1
    print(format_scores(scores))
    return 0


def run_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from eval.report import write_report

    training = Path(args.training) if args.training else None
    if training is not None and not (training / "metrics.jsonl").is_file():
        raise FileNotFoundError(f"--training {training} has no metrics.jsonl: give the --out of `r3rag train local`")
    out = Path(args.out) if args.out else None
    paths = write_report(Path(args.dir), out, training=training, baselines=args.baseline)
    for path in paths.values():
        print(path)
    return 0


def run_sweep(args: argparse.Namespace) -> int:
    import asyncio

    from eval.sweep import SECTIONS
    from eval.sweep import run_sweep as sweep

    return asyncio.run(sweep(*configs_from_args(args, SECTIONS)))
