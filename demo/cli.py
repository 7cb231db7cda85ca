"""``r3rag demo``: the main job on its embedded default (see :mod:`demo.run`)."""

from __future__ import annotations

import argparse

from r3_env.config import add_config_command, configs_from_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from demo.run import DemoConfig

    parser = add_config_command(
        subparsers,
        "demo",
        [("", DemoConfig)],
        run,
        help="train SmolLM2 end to end on CPU (world, services, cold start, SFT, PPO, evaluation, report)",
        description="Runs the whole pipeline on the synthetic world (with --data, on real questions split by id) and "
        "writes OUT/report.html: the untrained, SFT and PPO policies side by side, the training curves and every "
        "evaluated trajectory. By default SmolLM2-135M-Instruct, evaluated and sampled through vLLM's CPU build "
        "(bash scripts/setup_vllm.sh); it prints its plan with an estimate per stage first. --quick runs the same path "
        "on a small budget, --model tiny-random a 1.3M-parameter random model for path checks. Rerun to resume "
        "after an interruption.",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a demo run with other settings in --out")


def run(args: argparse.Namespace) -> int:
    import logging

    from demo.run import Demo, DemoConfig, format_summary

    for noisy in ("httpx", "transformers", "datasets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    [config] = configs_from_args(args, [("", DemoConfig)])
    demo = Demo(config)
    results = demo.run(overwrite=args.overwrite)
    print(format_summary(demo, results))
    return 0
