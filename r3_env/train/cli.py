"""``r3rag train local | model``: the single-machine trainer and the demo's model factory."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from r3_env.config import add_config_command, add_dataclass_arguments, build_config

if TYPE_CHECKING:
    from r3_env.train.local import LocalTrainConfig


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from r3_env.train.config import SECTIONS

    actions = subparsers.add_parser(
        "train", help="train on one machine (CPU or one GPU): cold-start SFT then PPO; build the demo's model"
    ).add_subparsers(dest="train_command", metavar="ACTION", required=True)
    add_config_command(
        actions,
        "local",
        SECTIONS,
        run_local,
        help="cold-start SFT, then PPO with a critic and GAE, on this machine (resumable)",
        description="SFT on --sft.data (r3rag coldstart sft-data), then PPO on --ppo.prompts with the agent's "
        "env:/reward:/services:/policy: sections (the retrieval and reward services must be running). Writes "
        "config.json, metrics.jsonl, tensorboard/, sft/policy, ppo/policy, ppo/health.jsonl (health warnings) and "
        "ppo/best_policy (best dev reward, with --ppo.eval_prompts) into --out; rerun to resume.",
    ).add_argument(
        "--recipe",
        help="a recipe (r3, r3_recall, lws: recipes/NAME.yaml; r2ag trains with r3rag r2ag train) or its file: its "
        "agent sections and its algorithm's design (estimator, clip, KL, dynamic sampling, temperature, top-p), not "
        "its cluster budget; --config and flags go over it",
    )
    from r3_env.train.model_factory import TinyModelConfig

    model = actions.add_parser(
        "model",
        help="build the demo's policy: a BPE tokenizer trained on a world and a random Qwen2",
        description="Writes an HF model folder (tokenizer with a ChatML template, random Qwen2 weights) to --out.",
    )
    model.add_argument("--world", default="runs/world", help="world folder (r3rag world --out)")
    model.add_argument("--out", default="runs/policy0", help="model folder to write")
    model.add_argument("--overwrite", action="store_true", help="replace a model built with other settings")
    add_dataclass_arguments(model, TinyModelConfig)
    model.set_defaults(func=run_model)


def local_config(args: argparse.Namespace) -> LocalTrainConfig:
    """``r3rag train local``'s settings: the recipe's (``--recipe``), then ``--config``'s, then the flags, each
    over the one before as :func:`r3_env.train.config.layered` says. The reward scheme and the step format are
    built here, so that their options fail before any training."""
    from r3_env.config import ConfigError, configs_from_values, load_yaml
    from r3_env.protocol import get_format
    from r3_env.recipes import LAUNCH_SECTIONS
    from r3_env.rewards import get_scheme
    from r3_env.train.config import SECTIONS, layered, recipe_settings
    from r3_env.train.local import LocalTrainConfig

    values = load_yaml(args.config) if args.config else {}
    if LAUNCH_SECTIONS & set(values):
        raise ConfigError(f"{args.config} is a recipe (its algo: section is the launch scripts'): give it as --recipe")
    if args.recipe:
        values = layered(recipe_settings(args.recipe), values)
    flags, args = _choice_flags(args)
    values = layered(values, flags)
    sections = configs_from_values(values, SECTIONS, args, where=args.config or "invalid option")
    config = LocalTrainConfig.from_sections(*sections)
    reward, policy = config.rollout.reward, config.rollout.policy
    get_scheme(reward.scheme, **reward.options)
    get_format(policy.step_format, **policy.format_options)
    return config


def _choice_flags(args: argparse.Namespace) -> tuple[dict[str, dict[str, Any]], argparse.Namespace]:
    """The reward scheme and step format flags and their options (JSON text, as given) as a layer of sections, and
    ``args`` without them: they merge over the file's and the recipe's as the file's merge over the recipe's."""
    from r3_env.train.config import CHOICE_OPTIONS

    layer: dict[str, dict[str, Any]] = {}
    rest = vars(args).copy()
    for (section, options), choice in CHOICE_OPTIONS.items():
        for name in (choice, options):
            value = rest.pop(f"{section}.{name}", None)
            if value is not None:
                layer.setdefault(section, {})[name] = value
    return layer, argparse.Namespace(**rest)


def run_local(args: argparse.Namespace) -> int:
    from r3_env.train.local import train_local

    config = local_config(args)
    results = train_local(config)
    for stage, folder in results.items():
        print(f"{stage} policy: {folder}")
    print(f"metrics: {config.run.out}/metrics.jsonl (tensorboard --logdir {config.run.out}/tensorboard)")
    return 0


def run_model(args: argparse.Namespace) -> int:
    from pathlib import Path

    from r3_env.train.model_factory import TinyModelConfig, build_tiny_policy

    config = build_config(TinyModelConfig, args, where="invalid option")
    folder = build_tiny_policy(Path(args.world), Path(args.out), config, overwrite=args.overwrite)
    print(f"tiny policy: {folder}")
    return 0
