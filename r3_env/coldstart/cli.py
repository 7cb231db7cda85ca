"""``r3rag coldstart synth`` (Algorithm 1), ``sft-data`` (Algorithm 2) and ``rl-data`` (RL's questions)."""

from __future__ import annotations

import argparse

from r3_env.config import add_config_command, configs_from_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from r3_env.coldstart.rl_data import RLDataConfig
    from r3_env.coldstart.sft_data import SFTDataConfig
    from r3_env.coldstart.synth import SECTIONS

    actions = subparsers.add_parser(
        "coldstart", help="cold-start data: trajectory synthesis and SFT data"
    ).add_subparsers(dest="coldstart_command", metavar="ACTION", required=True)
    add_config_command(
        actions,
        "synth",
        SECTIONS,
        run_synth,
        help="Algorithm 1: a teacher writes trajectories; keep the correct ones, best-of-N",
        description="Writes samples.jsonl (append-only; rerun to resume), trajectories.jsonl (best-of-N) and "
        "summary.json into --out. The teacher is an OpenAI-compatible chat endpoint (--teacher.kind openai "
        "--teacher.base_url URL --teacher.model NAME, key in $OPENAI_API_KEY) or, for the synthetic world, "
        "the scripted teacher. Documents come from --retrieval.url or a retriever YAML (--retrieval.config).",
    )
    add_config_command(
        actions,
        "sft-data",
        [("", SFTDataConfig)],
        run_sft_data,
        help="Algorithm 2: trajectories as SFT data for OpenRLHF's SFT trainer",
        description="Renders each correct trajectory as chat messages (the RL transcript, loss on the steps) "
        "or one example per step, and prints the OpenRLHF flags that read them.",
    )
    add_config_command(
        actions,
        "rl-data",
        [("", RLDataConfig)],
        run_rl_data,
        help="RL's questions: dataset rows the cold start did not ask, a seeded sample per dataset",
        description="Writes the FlashRAG rows of --data whose questions the --exclude files (the cold start's "
        "samples.jsonl) did not ask, --per_dataset of each, to --out: launch/ppo_r3.sh's PROMPT_DATA.",
    )


def run_synth(args: argparse.Namespace) -> int:
    import asyncio
    import sys

    from r3_env.coldstart.synth import SECTIONS, format_summary, synthesize
    from r3_env.coldstart.teacher import TeacherError

    config, env, teacher, retrieval, judge = configs_from_args(args, SECTIONS)
    try:
        summary, stats = asyncio.run(synthesize(config, env, teacher, retrieval, judge))
    except TeacherError as error:
        print(f"r3rag coldstart synth: {error}", file=sys.stderr)
        return 1
    print(format_summary(summary, config.out))
    if stats.failed:
        print(f"{stats.failed} samples failed ({stats.last_error}); rerun the same command to retry them")
        return 1
    return 0


def run_sft_data(args: argparse.Namespace) -> int:
    from r3_env.coldstart.sft_data import SFTDataConfig, build_sft_data, format_stats

    [config] = configs_from_args(args, [("", SFTDataConfig)])
    print(format_stats(build_sft_data(config)))
    return 0


def run_rl_data(args: argparse.Namespace) -> int:
    from r3_env.coldstart.rl_data import RLDataConfig, build_rl_data, format_stats

    [config] = configs_from_args(args, [("", RLDataConfig)])
    print(format_stats(build_rl_data(config), config.out))
    return 0
