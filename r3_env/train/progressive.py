"""``r3rag r2ag train``: R2AG's progressive iterative training ("self-evolve").

The method and the paper's settings: docs/recipes/r2ag.md#progressive-training.

An optional cold start (``sft.data``: expansion-step SFT data from ``r3rag coldstart sft-data
--step_format multi_query``) trains the first policy. Round k trains the steering policy on
one-expansion-step prompts (the question plus the documents kept so far), then grows each
prompt's tree by one level with the trained policy, prunes it to the branches that found gold
documents, and writes the next round's prompts: the incomplete trees' questions with every gold
document found so far as their ``start_documents``. Rounds run until every tree is complete or
``r2ag.rounds`` (L_MAX) is reached.

A round's folder ``<out>/round<k>/`` holds ``prompts.jsonl`` (FlashRAG rows whose ``metadata`` has
``supporting_passage_ids`` and ``start_documents``), the trainer's output (``train/``, then
``trained.json``), ``trees.jsonl`` (append-only, one expanded tree per prompt) and ``done.json``.
A rerun resumes where it stopped: finished rounds are skipped, the local trainer resumes from its
checkpoints, and expansion goes on from the trees already written.

``r2ag.trainer``: ``local`` trains with r3rag's local PPO trainer (the embedded default, CPU);
``openrlhf`` runs ``launch/dapo_r2ag.sh`` (a Ray job on a cluster) with PROMPT_DATA, POLICY,
SAVE_DIR and ROUND set for the round. Expansion runs here with HF generate on ``run.device``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from r3_env.config import ConfigError, add_config_command, configs_from_args
from r3_env.data import JsonlWriter, QAItem, existing_ids, iter_jsonl, read_dataset, read_label, write_dataset
from r3_env.recipes import LAUNCH_SECTIONS
from r3_env.tree import Steer, Tree, TreeConfig, gold_documents

if TYPE_CHECKING:  # torch loads with the trainer, not with the CLI
    from r3_env.train.local import LocalTrainConfig

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ProgressiveConfig:
    prompts: str = field(default="", metadata={"help": "FlashRAG training questions with gold passage ids"})
    out: str = field(default="runs/r2ag", metadata={"help": "folder of the rounds (rerun to resume)"})
    rounds: int = field(default=5, metadata={"help": "at most this many rounds (L_MAX: one tree level each)"})
    trainer: Literal["local", "openrlhf"] = field(
        default="local", metadata={"help": "local (r3rag's PPO trainer) or openrlhf (launch/dapo_r2ag.sh)"}
    )
    launch_script: str = field(default="", metadata={"help": "openrlhf: the round's script [launch/dapo_r2ag.sh]"})
    expand_temperature: float = field(default=0.0, metadata={"help": "sampling temperature of the expansion"})
    expand_batch: int = field(default=16, metadata={"help": "prompts expanded concurrently"})

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.expand_batch < 1 or self.expand_temperature < 0:
            raise ValueError(
                "r2ag.rounds and r2ag.expand_batch must be at least 1 and expand_temperature 0 or more, got "
                f"{self.rounds}, {self.expand_batch}, {self.expand_temperature}"
            )


def round_folder(out: Path, number: int) -> Path:
    return out / f"round{number}"


def first_round_prompts(items: list[QAItem]) -> list[QAItem]:
    """Round 1: every question with gold ids, from the root, or from the documents its row's
    ``metadata.start_documents`` already holds (a warm start)."""
    kept = []
    for item in items:
        label = read_label(item.to_json())
        if not label.gold_ids:
            raise ValueError(
                f"question {item.id!r} names no gold passages: R2AG trains on gold hits "
                "(metadata.supporting_passage_ids)"
            )
        if label.problem:
            raise ValueError(f"question {item.id!r}: {label.problem}; give metadata.start_documents as that list")
        kept.append(
            dataclasses.replace(
                item, metadata={**item.metadata, "start_documents": item.metadata.get("start_documents", [])}
            )
        )
    return kept


def next_prompts(items: list[QAItem], trees: dict[str, Tree]) -> list[QAItem]:
    """The incomplete trees' questions, each with the gold documents its pruned tree holds as context."""
    following = []
    for item in items:
        tree = trees[item.id]
        if tree.complete:
            continue
        context = [p.to_json() for p in gold_documents(tree)]
        following.append(dataclasses.replace(item, metadata={**item.metadata, "start_documents": context}))
    return following


class ProgressiveTrainer:
    """Runs the rounds. ``train_settings`` are the local trainer's sections (run, model, sft, ppo, env, ...)."""

    def __init__(self, config: ProgressiveConfig, train_settings: LocalTrainConfig) -> None:
        if not config.prompts:
            raise ConfigError("r2ag.prompts is required: FlashRAG training questions with gold passage ids")
        self.config, self.settings = config, train_settings
        self.out = Path(config.out)
        rollout = train_settings.rollout
        if rollout.policy.step_format != "multi_query" or rollout.env.max_steps != 1:
            raise ConfigError(
                "R2AG trains one expansion step per sample: set policy.step_format multi_query and env.max_steps 1 "
                "(recipes/r2ag.yaml)"
            )
        if rollout.env.question_docs:
            raise ConfigError(
                "env.question_docs: R2AG's rounds start from the gold documents their tree found, which the tree "
                "retrieves without the question's own documents; leave env.question_docs at 0"
            )
        missing = [name for name in ("survivors_base", "survivors_predicted") if name not in rollout.reward.options]
        if missing:
            raise ConfigError(
                f"reward.options lacks {', '.join(missing)}: the tree's Top-Survivor t (recipes/r2ag.yaml)"
            )

    def run(self) -> str:
        """Cold-start SFT when ``sft.data`` is set, then all rounds (resuming); returns the last round's policy."""
        self.out.mkdir(parents=True, exist_ok=True)
        policy = self.cold_start()
        for number in range(1, self.config.rounds + 1):
            folder = round_folder(self.out, number)
            done = folder / "done.json"
            if done.is_file():
                policy = json.loads(done.read_text())["policy"]
                remaining = json.loads(done.read_text())["next_prompts"]
                logger.info("round %d already done (%d prompts for the next)", number, remaining)
                if not remaining:
                    break
                continue
            prompts = folder / "prompts.jsonl"
            if number == 1 and not prompts.is_file():
                write_dataset(prompts, first_round_prompts(read_dataset(self.config.prompts)))
            items = read_dataset(prompts)
            started = time.perf_counter()
            policy = self.train(number, prompts, policy)
            trees = self.expand(folder, items, policy)
            following = next_prompts(items, trees)
            if following:  # written after the last round too: a rerun with more rounds goes on from them
                write_dataset(round_folder(self.out, number + 1) / "prompts.jsonl", following)
            complete = sum(tree.complete for tree in trees.values())
            summary = {
                "round": number,
                "policy": str(policy),
                "prompts": len(items),
                "complete": complete,
                "gold_found": sum(len(tree.gold_found()) for tree in trees.values()),
                "gold_total": sum(len(tree.gold_ids) for tree in trees.values()),
                "next_prompts": len(following),
                "seconds": time.perf_counter() - started,
            }
            done.write_text(json.dumps(summary, indent=2) + "\n")
            logger.info(
                "round %d: %d/%d trees complete, %d prompts for round %d (%.0f s)",
                number,
                complete,
                len(items),
                len(following),
                number + 1,
                summary["seconds"],
            )
            if not following:
                break
        return str(policy)

    def cold_start(self) -> str:
        """SFT on expansion steps (``r3rag coldstart sft-data --step_format multi_query``) into ``<out>/sft``."""
        settings = self.settings
        if not settings.sft.data:
            return settings.model.policy
        if self.config.trainer == "openrlhf":
            raise ConfigError(
                "r2ag.trainer openrlhf: run the cold start with launch/sft_coldstart.sh, then give "
                "its model as --model.policy and leave sft.data empty"
            )
        from r3_env.train.local import train_local

        config = dataclasses.replace(
            settings,
            run=dataclasses.replace(settings.run, out=str(self.out / "sft")),
            ppo=dataclasses.replace(settings.ppo, prompts=""),
        )
        return str(train_local(config, stages=("sft",))["sft"])

    def train(self, number: int, prompts: Path, policy: str) -> str:
        """The round's policy: trained now, or read from ``trained.json`` when a rerun finds it done."""
        folder = round_folder(self.out, number) / "train"
        marker = round_folder(self.out, number) / "trained.json"
        if marker.is_file():
            return json.loads(marker.read_text())["policy"]
        if self.config.trainer == "openrlhf":
            trained = self._train_openrlhf(number, prompts, policy, folder)
        else:
            from r3_env.train.local import train_local

            settings = self.settings
            config = dataclasses.replace(
                settings,
                run=dataclasses.replace(settings.run, out=str(folder)),
                model=dataclasses.replace(settings.model, policy=policy),
                sft=dataclasses.replace(settings.sft, data=""),
                ppo=dataclasses.replace(settings.ppo, prompts=str(prompts)),
            )
            trained = str(train_local(config, stages=("ppo",))["ppo"])
        marker.write_text(json.dumps({"policy": trained, "from": policy}) + "\n")
        return trained

    def _train_openrlhf(self, number: int, prompts: Path, policy: str, folder: Path) -> str:
        script = self.config.launch_script or str(ROOT / "launch" / "dapo_r2ag.sh")
        variables = {"PROMPT_DATA": str(prompts), "POLICY": policy, "SAVE_DIR": str(folder), "ROUND": str(number)}
        logger.info("round %d: bash %s with %s", number, script, variables)
        subprocess.run(["bash", script], check=True, env={**os.environ, **variables})
        return str(folder)

    def expand(self, folder: Path, items: list[QAItem], policy: str) -> dict[str, Tree]:
        """One tree level per prompt with the round's policy (trees.jsonl is append-only and resumed)."""
        path = folder / "trees.jsonl"
        done = existing_ids(path)
        todo = [item for item in items if item.id not in done]
        if todo:
            asyncio.run(self._expand(path, todo, policy))
        trees = {row["id"]: Tree.from_json(row["tree"]) for _, row in iter_jsonl(path)}
        missing = [item.id for item in items if item.id not in trees]
        if missing:
            raise RuntimeError(f"{path}: no tree for {len(missing)} prompts (first {missing[0]!r})")
        return trees

    async def _expand(self, path: Path, items: list[QAItem], policy: str) -> None:
        from r3_env.retrieval.client import AsyncRetrievalClient
        from r3_env.tree import expand_tree

        settings = self.settings
        rollout, services = settings.rollout, settings.rollout.services
        steering = load_steering(settings, policy, self.config.expand_batch, self.config.expand_temperature)
        steer, step_format = steering.steer, steering.step_format
        options = settings.rollout.reward.options
        tree_config = TreeConfig(
            topk=rollout.env.topk,
            max_iterations=1,
            survivors_base=options["survivors_base"],
            survivors_predicted=options["survivors_predicted"],
        )
        client = AsyncRetrievalClient(services.retriever_url, timeout=services.timeout_s, retries=services.retries)
        started, written = time.perf_counter(), 0
        try:
            with JsonlWriter(path) as writer:
                for start in range(0, len(items), self.config.expand_batch):
                    batch = items[start : start + self.config.expand_batch]
                    labels = [read_label(item.to_json()) for item in batch]
                    trees = await asyncio.gather(
                        *(
                            expand_tree(
                                item.question,
                                steer,
                                client.search,
                                step_format,
                                tree_config,
                                gold_ids=label.gold_ids,
                                context=label.start_documents,
                            )
                            for item, label in zip(batch, labels, strict=True)
                        )
                    )
                    for item, tree in zip(batch, trees, strict=True):
                        writer.write({"id": item.id, "tree": tree.to_json()})
                    written += len(batch)
                    rate = written / (time.perf_counter() - started)
                    logger.info("expanded %d/%d prompts (%.2f/s)", written, len(items), rate)
        finally:
            await client.aclose()


@dataclass
class Steering:
    """A policy loaded to steer trees: its engine (HF generate), renderer and format, and the steer itself."""

    tokenizer: Any
    model: Any
    engine: Any
    renderer: Any
    step_format: Any
    params: Any
    steer: Steer


def load_steering(
    settings: LocalTrainConfig, policy: str, batch: int, temperature: float = 0.0, script: Any = None
) -> Steering:
    """``policy`` steering as the agent config (``settings.rollout``) renders its steps; ``script``: HFEngine's
    constrained decoding (benchmarks force known steps through the real model)."""
    from r3_env.engines import HFEngine, SamplingParams
    from r3_env.protocol import ChatRenderer, get_format
    from r3_env.train.models import load_actor, load_tokenizer, pick_device
    from r3_env.tree import token_steerer

    rollout = settings.rollout
    tokenizer = load_tokenizer(policy)
    model = load_actor(policy, dataclasses.replace(settings.model, lora_rank=0), pick_device(settings.run.device))
    engine = HFEngine(model.model.eval(), tokenizer, max_batch=batch, script=script)
    step_format = get_format(rollout.policy.step_format, **rollout.policy.format_options)
    renderer = ChatRenderer(tokenizer, step_format, rollout.policy.chat_template, doc_chars=rollout.env.doc_chars)
    params = SamplingParams(temperature=temperature, seed=settings.run.seed)
    steer = token_steerer(renderer, engine, params, rollout.env.step_budget, settings.ppo.max_len)
    return Steering(tokenizer, model, engine, renderer, step_format, params, steer)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from r3_env.train.config import SECTIONS

    actions = subparsers.add_parser(
        "r2ag", help="R2AG: progressive iterative training of a retrieval steering policy"
    ).add_subparsers(dest="r2ag_command", metavar="ACTION", required=True)
    add_config_command(
        actions,
        "train",
        [("r2ag.", ProgressiveConfig), *SECTIONS],
        run_train,
        help="progressive rounds: train one expansion step per prompt, grow and prune the trees, repeat (resumable)",
        description="Round k trains the policy (--r2ag.trainer local: r3rag's PPO trainer with the local sections; "
        "openrlhf: launch/dapo_r2ag.sh) on <out>/round<k>/prompts.jsonl, expands each prompt one tree level with "
        "the trained policy (trees.jsonl), prunes to the gold-hitting branches and writes round k+1's prompts with "
        "the gold documents found so far. The retrieval service must be running (services.retriever_url).",
    )


def run_train(args: argparse.Namespace) -> int:
    from r3_env.train.config import SECTIONS
    from r3_env.train.local import LocalTrainConfig

    # --config is a recipe (recipes/r2ag.yaml): its algo and tree sections are the cluster's and evaluation's
    config, *sections = configs_from_args(args, [("r2ag.", ProgressiveConfig), *SECTIONS], ignored=LAUNCH_SECTIONS)
    policy = ProgressiveTrainer(config, LocalTrainConfig.from_sections(*sections)).run()
    print(f"policy: {policy}")
    print(f"rounds: {config.out}/round*/done.json")
    return 0
