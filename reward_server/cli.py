"""``r3rag reward serve``: the judge service for relevance, correctness and whole-transcript rewards."""

from __future__ import annotations

import argparse
import dataclasses
import os

from r3_env.config import add_config_command, configs_from_args
from reward_server.config import (
    JUDGE_API_KEY_ENV,
    REWARD_API_KEY_ENV,
    JudgeConfig,
    RewardConfig,
    RewardServiceConfig,
)

SECTIONS = (("judge", JudgeConfig), ("reward", RewardConfig), ("service", RewardServiceConfig))


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    actions = subparsers.add_parser(
        "reward", help="serve the LLM judge (relevance, correctness, rewards)"
    ).add_subparsers(dest="reward_command", metavar="ACTION", required=True)
    add_config_command(
        actions,
        "serve",
        [(f"{name}.", cls) for name, cls in SECTIONS],
        run_serve,
        help="start the reward server",
        description="Serves POST /relevance, /correctness and /get_reward (OpenRLHF's remote reward), GET /health "
        "and /metrics. reward.yaml has three mappings: judge, reward and service.",
    )


def load_configs(args: argparse.Namespace) -> tuple[JudgeConfig, RewardConfig, RewardServiceConfig]:
    judge, reward, service = configs_from_args(args, [(f"{name}.", cls) for name, cls in SECTIONS])
    if not judge.api_key and os.environ.get(JUDGE_API_KEY_ENV):
        judge = dataclasses.replace(judge, api_key=os.environ[JUDGE_API_KEY_ENV])
    if not service.api_key and os.environ.get(REWARD_API_KEY_ENV):
        service = dataclasses.replace(service, api_key=os.environ[REWARD_API_KEY_ENV])
    return judge, reward, service


def run_serve(args: argparse.Namespace) -> int:
    import logging

    from r3_env.serving import serve
    from reward_server.app import create_app

    judge, reward, service = load_configs(args)
    app = create_app(judge, reward, service)
    logging.getLogger(__name__).info(
        "reward server (%s judge, %s scheme) on http://%s:%d", judge.backend, reward.scheme, service.host, service.port
    )
    serve(app, service.host, service.port)
    return 0
