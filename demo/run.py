"""``r3rag demo``: the whole pipeline on one machine, on the embedded default, in minutes on CPU.

In order: a synthetic world; its BM25 index; the retrieval service and the reward server (lexical
judge) as real local processes on free ports; cold-start trajectories from the world's scripted
teacher (Algorithm 1) and SFT data (Algorithm 2); the policy (by default a tiny one from the
model factory; ``--model smollm2-135m-instruct`` a real instruct model, with its own recipe);
evaluation of the untrained policy; SFT; evaluation; PPO with a critic and GAE; evaluation; and
``report.html`` with the before/after table, the training curves and the trajectory browser.

Each stage is the library's own (the same calls ``r3rag world``, ``index build``, ``coldstart
synth``, ``train local`` and ``eval run/score/report`` make), and each resumes: a rerun after an
interruption picks up where it stopped. ``demo.json`` records the settings, each stage's wall
time and the final numbers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from demo.services import ServiceProcess

logger = logging.getLogger(__name__)

DEMO_FILE = "demo.json"


@dataclass(frozen=True)
class Budget:
    """How much of everything one demo run does."""

    entities: int
    coldstart_questions: int  # train questions the scripted teacher answers (0: all); about 60% are kept
    sft_epochs: int
    ppo_iterations: int
    rollout_batch_size: int
    n_samples_per_prompt: int
    eval_questions: int  # dev questions per evaluation


@dataclass(frozen=True)
class ModelRecipe:
    """How the demo trains one kind of policy: its budgets (full and ``--quick``) and optimiser settings.

    A random tiny model needs a large learning rate and many epochs to learn the protocol at all; a
    pre-trained instruct model needs small steps, and each of its steps costs a hundred times more.
    """

    full: Budget
    quick: Budget
    sft: dict[str, Any]
    ppo: dict[str, Any]


TINY = ModelRecipe(
    full=Budget(
        entities=2000,
        coldstart_questions=0,
        sft_epochs=4,
        ppo_iterations=8,
        rollout_batch_size=8,
        n_samples_per_prompt=4,
        eval_questions=100,
    ),
    quick=Budget(
        entities=400,
        coldstart_questions=0,
        sft_epochs=3,
        ppo_iterations=3,
        rollout_batch_size=4,
        n_samples_per_prompt=4,
        eval_questions=24,
    ),
    sft={"lr": 3e-3, "batch_size": 8, "micro_batch_size": 8},
    ppo={"micro_batch_size": 8, "train_batch_size": 16, "actor_lr": 2e-5, "critic_lr": 1e-3, "critic_warmup": 2},
)
PRETRAINED = ModelRecipe(
    full=Budget(
        entities=2000,
        coldstart_questions=160,
        sft_epochs=2,
        ppo_iterations=6,
        rollout_batch_size=4,
        n_samples_per_prompt=4,
        eval_questions=30,  # about 15 s a question for SmolLM2 on 2 cores
    ),
    quick=Budget(
        entities=200,
        coldstart_questions=16,
        sft_epochs=1,
        ppo_iterations=2,  # the first warms the critic up; the second trains the actor
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        eval_questions=4,
    ),
    sft={"lr": 2e-5, "batch_size": 8, "micro_batch_size": 2},
    ppo={"micro_batch_size": 2, "train_batch_size": 16, "actor_lr": 1e-6, "critic_lr": 9e-6, "critic_warmup": 1},
)


@dataclass(frozen=True)
class Method:
    """Which method the demo trains: its step format, reward scheme and RL algorithm (a recipe, not a fork)."""

    step_format: str
    reward: dict[str, Any]
    ppo: dict[str, Any]
    title: str  # the RL stage, as the demo logs it
    stage_switch: float | None = None  # share of the PPO iterations after which a staged reward's stage 2 starts
    # also evaluate the RL policy answering without retrieval, for the report's answer categories
    no_retrieval_eval: bool = False

    def switch_at(self, iterations: int) -> int | None:
        """The RL iteration (0-based, the trainer's step) at which stage 2 starts, for a staged reward."""
        return None if self.stage_switch is None else round(self.stage_switch * iterations)


METHODS = {
    # R3-RAG: labelled sections, relevance x outcome process rewards, PPO with a critic and GAE
    "r3": Method(step_format="r3", reward={"scheme": "r3"}, ppo={}, title="PPO (critic, GAE, per-step rewards)"),
    # Learning when to search: tags, the staged retrieval-cost reward (stage 2 from half-way), DAPO's
    # group-normalised advantages with clip-higher and no KL (launch/dapo_lws.sh on a cluster)
    "lws": Method(
        step_format="tags",
        reward={"scheme": "lws", "placement": "scalar"},
        ppo={"estimator": "group_norm", "eps_clip_high": 0.28, "init_kl_coef": 0.0, "critic_warmup": 0},
        title="RL (group-normalised advantages, clip-higher, staged retrieval-cost reward)",
        stage_switch=0.5,
        no_retrieval_eval=True,
    ),
}


@dataclass(frozen=True)
class DemoConfig:
    out: str = field(default="demo_out", metadata={"help": "folder for everything the demo writes"})
    model: str = field(
        default="tiny-random",
        metadata={
            "help": "the policy: tiny-random (the model factory), smollm2-135m-instruct (a real instruct model, "
            "r3rag model list), or a local HF model folder"
        },
    )
    recipe: str = field(
        default="r3",
        metadata={"help": "the method: r3 (R3-RAG) or lws (Learning when to search: tags, staged RC reward, DAPO)"},
    )
    scheme: str = field(
        default="", metadata={"help": "override the recipe's reward scheme (e.g. outcome, the ablation; '': keep)"}
    )
    quick: bool = field(default=False, metadata={"help": "the same path on a smaller budget"})
    seed: int = field(default=0, metadata={"help": "world, model and training seed"})
    threads: int = field(default=0, metadata={"help": "torch CPU threads (0: torch's default)"})
    sft_epochs: int = field(default=0, metadata={"help": "override the budget's SFT epochs (0: keep)"})
    ppo_iterations: int = field(default=0, metadata={"help": "override the budget's PPO iterations (0: keep)"})
    lora_rank: int = field(
        default=0, metadata={"help": "train the policy through LoRA adapters of this rank (0: full)"}
    )
    eval_questions: int = field(default=0, metadata={"help": "override the budget's dev questions (0: keep)"})

    def __post_init__(self) -> None:
        from r3_env.model_registry import MODELS

        if min(self.threads, self.sft_epochs, self.ppo_iterations, self.eval_questions, self.lora_rank) < 0:
            raise ValueError("threads and the overrides must be 0 or more")
        if self.recipe not in METHODS:
            raise ValueError(f"recipe: {self.recipe!r} is not one of {', '.join(METHODS)}")
        if self.scheme:
            from r3_env.rewards import get_scheme

            get_scheme(self.scheme)  # a ValueError naming the schemes there are
        if self.model not in MODELS:
            if not (Path(self.model) / "config.json").is_file():
                raise ValueError(
                    f"model: {self.model!r} is neither a registry model ({', '.join(MODELS)}) nor a local HF model "
                    "folder with a config.json; the demo never downloads one"
                )
            object.__setattr__(self, "model", str(Path(self.model).resolve()))  # a rerun from elsewhere finds it

    @property
    def method(self) -> Method:
        return METHODS[self.recipe]

    @property
    def model_recipe(self) -> ModelRecipe:
        """TINY for the factory's models (by name, or a folder it wrote), PRETRAINED for the rest."""
        from r3_env.train.model_factory import FACTORY_FILE

        factory_made = self.model == "tiny-random" or (Path(self.model) / FACTORY_FILE).is_file()
        return TINY if factory_made else PRETRAINED

    @property
    def budget(self) -> Budget:
        budget = self.model_recipe.quick if self.quick else self.model_recipe.full
        overrides = {
            key: getattr(self, key) for key in ("sft_epochs", "ppo_iterations", "eval_questions") if getattr(self, key)
        }
        return dataclasses.replace(budget, **overrides)


# The demo's RL environment: the paper's (spec section 3: top-5, unseen documents only, at most 10,
# 512 characters each) with one new document per step instead of two and shorter steps, which halves
# a transcript's tokens (about 720 instead of 1,360 with the demo's tokenizer) and so CPU time.
ENV = {
    "max_steps": 5,
    "topk": 5,
    "dedup_docs": True,
    "docs_per_step": 1,
    "max_total_docs": 10,
    "doc_chars": 512,
    "format_retries": 0,
    "max_step_tokens": 96,
}
# The tiny policy: 4 layers learn the step format within the budget where 2 do not (measured).
MODEL = {"vocab_size": 2048, "hidden_size": 128, "layers": 4, "heads": 4, "kv_heads": 2, "intermediate_size": 512}


class Demo:
    def __init__(self, config: DemoConfig) -> None:
        self.config = config
        self.budget = config.budget
        self.out = Path(config.out)
        self.stages: dict[str, float] = {}
        self.paths: dict[str, Path] = {}
        self.urls: dict[str, str] = {}

    @contextmanager
    def stage(self, name: str, title: str) -> Iterator[None]:
        logger.info("== %s", title)
        started = time.perf_counter()
        yield
        self.stages[name] = round(time.perf_counter() - started, 1)
        logger.info("== %s: %.1f s", title, self.stages[name])

    def check_folder(self, overwrite: bool) -> None:
        """Refuse to mix two demos' settings in one folder (a rerun of the same one resumes)."""
        record = self.out / DEMO_FILE
        if not record.is_file():
            return
        previous = json.loads(record.read_text()).get("config") or {}
        previous.setdefault("model", "tiny-random")  # demos recorded before --model existed
        previous.setdefault("recipe", "r3")  # and before --recipe and --scheme
        previous.setdefault("scheme", "")
        previous.setdefault("lora_rank", 0)
        if previous == dataclasses.asdict(self.config):
            return
        if not overwrite:
            raise ValueError(
                f"{self.out} holds a demo run with other settings: pass --out DIR for this one, or --overwrite"
            )
        shutil.rmtree(self.out)

    def write_record(self, results: dict[str, Any]) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        record = {
            "config": dataclasses.asdict(self.config),
            "budget": dataclasses.asdict(self.budget),
            "stages_s": self.stages,
            "paths": {key: str(path) for key, path in self.paths.items()},
            "services": self.urls,
            "results": results,
        }
        (self.out / DEMO_FILE).write_text(json.dumps(record, indent=2) + "\n")

    # -- stages ---------------------------------------------------------------------------------

    def world(self) -> Path:
        from r3_env.world.build import WorldConfig, generate_world

        folder = self.out / "world"
        with self.stage("world", "1. synthetic world"):
            generate_world(WorldConfig(entities=self.budget.entities, seed=self.config.seed), folder)
        self.paths["world"] = folder
        return folder

    def index(self, world: Path) -> Path:
        from r3_env.retrieval.index_builder import IndexBuildConfig, build_index

        with self.stage("index", "2. BM25 index"):  # rebuilt every run: a fraction of a second at this size
            config = IndexBuildConfig(corpus_path=str(world / "corpus.jsonl"), save_dir=str(self.out / "index"))
            index = build_index(config)
        self.paths["index"] = index
        return index

    def services(self, world: Path, index: Path) -> tuple[ServiceProcess, ServiceProcess]:
        folder = self.out / "services"
        folder.mkdir(parents=True, exist_ok=True)
        retriever_yaml = folder / "retriever.yaml"
        retriever_yaml.write_text(
            yaml.safe_dump(
                {"retrieval_method": "bm25", "index_path": str(index), "corpus_path": str(world / "corpus.jsonl")}
            )
        )
        reward_yaml = folder / "reward.yaml"
        reward_yaml.write_text(yaml.safe_dump({"judge": {"backend": "lexical"}}))
        retriever = ServiceProcess(
            ["retriever", "serve", "--config", str(retriever_yaml)], log=folder / "retriever.log"
        )
        reward = ServiceProcess(["reward", "serve", "--config", str(reward_yaml)], log=folder / "reward.log")
        self.paths["services"] = folder
        return retriever, reward

    def coldstart(self, world: Path, retriever_url: str) -> Path:
        from r3_env.coldstart.synth import SynthConfig, synthesize
        from r3_env.coldstart.teacher import TeacherConfig
        from r3_env.env import EnvConfig
        from r3_env.runs import RetrievalSource

        folder = self.out / "coldstart"
        with self.stage("coldstart", "4. cold-start trajectories (scripted teacher, Algorithm 1)"):
            config = SynthConfig(
                data=str(world / "train.jsonl"),
                out=str(folder),
                samples=1,
                max_questions=self.budget.coldstart_questions,
                step_format=self.config.method.step_format,
            )
            asyncio.run(
                synthesize(config, EnvConfig(**ENV), TeacherConfig(kind="scripted"), RetrievalSource(url=retriever_url))
            )
        self.paths["coldstart"] = folder
        return folder / "trajectories.jsonl"

    def policy(self, world: Path) -> Path:
        from r3_env.model_registry import MODELS, get_model
        from r3_env.train.model_factory import TinyModelConfig, build_tiny_policy

        model = self.config.model
        if model == "tiny-random":
            folder = self.out / "policy0"
            with self.stage("model", "5a. tiny policy (BPE tokenizer on the world, random Qwen2)"):
                sizes = TinyModelConfig(**MODEL, seed=self.config.seed, step_format=self.config.method.step_format)
                build_tiny_policy(world, folder, sizes)
        elif model in MODELS:
            folder = self.out / "policy0"
            with self.stage("model", f"5a. {model} (r3rag model get)"):
                get_model(model, folder)
        else:
            folder = Path(model)
            with self.stage("model", f"5a. the policy in {folder}"):
                pass
        self.paths["policy0"] = folder
        return folder

    def sft_data(self, trajectories: Path, policy: Path) -> Path:
        from r3_env.coldstart.sft_data import SFTDataConfig, build_sft_data

        out = trajectories.with_name("sft.jsonl")
        with self.stage("sft_data", "5b. SFT data (Algorithm 2)"):
            if not out.is_file():
                build_sft_data(
                    SFTDataConfig(
                        input=str(trajectories),
                        out=str(out),
                        tokenizer=str(policy),
                        doc_chars=ENV["doc_chars"],
                        step_format=self.config.method.step_format,
                    )
                )
        return out

    def train_config(self, policy: Path, sft_data: Path, world: Path, retriever_url: str, reward_url: str) -> Any:
        from r3_env.config import configs_from_values
        from r3_env.train.config import SECTIONS
        from r3_env.train.local import LocalTrainConfig

        budget, method = self.budget, self.config.method
        reward = dict(method.reward)
        reward["scheme"] = self.config.scheme or reward["scheme"]
        switch = method.switch_at(budget.ppo_iterations)
        if switch is not None and reward["scheme"] == method.reward["scheme"]:
            from r3_env.model_registry import offline_minilm_path

            reward.update(options={"switch_step": switch}, query_encoder=offline_minilm_path())
        values = {
            "out": str(self.out / "train"),
            "seed": self.config.seed,
            "threads": self.config.threads,
            "model": {"policy": str(policy), "lora_rank": self.config.lora_rank},
            "sft": {"data": str(sft_data), "epochs": budget.sft_epochs, **self.config.model_recipe.sft},
            "ppo": {
                "prompts": str(world / "train.jsonl"),
                "iterations": budget.ppo_iterations,
                "rollout_batch_size": budget.rollout_batch_size,
                "n_samples_per_prompt": budget.n_samples_per_prompt,
                "max_len": 3072,
                **self.config.model_recipe.ppo,
                **method.ppo,
            },
            "env": ENV,
            "reward": reward,
            "policy": {"step_format": method.step_format},
            "services": {"retriever_url": retriever_url, "reward_url": reward_url},
        }
        return LocalTrainConfig.from_sections(*configs_from_values(values, SECTIONS, where="demo"))

    def evaluate(
        self, name: str, policy: Path, world: Path, retriever: str, reward: str, eval_method: str = "r3"
    ) -> dict[str, Any]:
        from eval.engines import EngineConfig, GenerationConfig
        from eval.run import EvalRunConfig, run_eval
        from eval.score import ScoreConfig, score_run
        from r3_env.env import EnvConfig
        from r3_env.runs import JudgeConfig, RetrievalSource

        folder = self.out / "eval" / name
        config = EvalRunConfig(
            data=str(world / "dev.jsonl"),
            out=str(folder),
            name=name,
            max_questions=self.budget.eval_questions,
            concurrency=32,
            step_format=self.config.method.step_format,
            method=eval_method,
        )
        retrieval = RetrievalSource(url=retriever)
        asyncio.run(
            run_eval(
                config,
                EnvConfig(**ENV),
                EngineConfig(kind="hf", model=str(policy), dtype="float32"),
                GenerationConfig(),
                retrieval,
            )
        )
        scores = asyncio.run(score_run(ScoreConfig(run=str(folder)), JudgeConfig(url=reward)))
        self.paths[f"eval_{name}"] = folder
        return scores

    # -- the whole pipeline -----------------------------------------------------------------------

    def run(self, overwrite: bool = False) -> dict[str, Any]:
        from eval.report import write_report
        from r3_env.train.local import train_local

        self.check_folder(overwrite)
        self.out.mkdir(parents=True, exist_ok=True)
        self.write_record({})
        world = self.world()
        index = self.index(world)
        retriever, reward = self.services(world, index)
        results: dict[str, Any] = {}
        with self.stage("services", "3. retrieval service and reward server (local processes)"):
            retriever.start()
            reward.start()
        self.urls = {"retriever": retriever.url, "reward": reward.url}
        try:
            logger.info(
                "retrieval service %s, reward server %s (logs in %s)", retriever.url, reward.url, self.paths["services"]
            )
            trajectories = self.coldstart(world, retriever.url)
            policy0 = self.policy(world)
            sft_data = self.sft_data(trajectories, policy0)
            config = self.train_config(policy0, sft_data, world, retriever.url, reward.url)
            with self.stage("eval_untrained", "6a. evaluate the untrained policy"):
                results["untrained"] = _summary(self.evaluate("untrained", policy0, world, retriever.url, reward.url))
            with self.stage("sft", "6b. SFT on the cold-start data"):
                sft_policy = train_local(config, stages=("sft",))["sft"]
            with self.stage("eval_sft", "7. evaluate the SFT policy"):
                results["sft"] = _summary(self.evaluate("sft", sft_policy, world, retriever.url, reward.url))
            with self.stage("ppo", f"8. {self.config.method.title} from the SFT policy"):
                ppo_policy = train_local(config)["ppo"]
            with self.stage("eval_ppo", "9. evaluate the PPO policy"):
                results["ppo"] = _summary(self.evaluate("ppo", ppo_policy, world, retriever.url, reward.url))
            if self.config.method.no_retrieval_eval:
                with self.stage("eval_ppo_direct", "9b. evaluate the PPO policy answering without retrieval"):
                    scores = self.evaluate("ppo_direct", ppo_policy, world, retriever.url, reward.url, "direct")
                    results["ppo_direct"] = _summary(scores)
        finally:
            retriever.stop()
            reward.stop()
        with self.stage("report", "10. report"):
            paths = write_report(self.out / "eval", self.out, training=self.out / "train")
        self.paths.update(report=paths["html"], train=self.out / "train", sft_policy=sft_policy, ppo_policy=ppo_policy)
        self.write_record(results)
        return results


def _summary(scores: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers of one scored run (the average over its datasets)."""
    final = scores["average"]["final"]
    keys = ("acc", "em", "f1", "answered", "avg_steps", "avg_retrievals", "avg_docs", "recall", "full_recall")
    return {key: final.get(key) for key in keys}


def format_summary(demo: Demo, results: dict[str, Any]) -> str:
    """The before/after table, where the time went and where everything is."""

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}"

    lines = [
        f"r3rag demo ({demo.config.model}, {demo.config.recipe} recipe, {'quick' if demo.config.quick else 'full'}, "
        f"seed {demo.config.seed}): "
        f"{demo.budget.eval_questions} dev questions per evaluation",
        f"  {'policy':<11}{'ACC':>7}{'EM':>7}{'F1':>7}{'RC':>6}{'answered':>10}{'steps':>7}{'docs':>7}"
        f"{'recall':>8}{'full':>7}",
    ]
    for name, m in results.items():
        lines.append(
            f"  {name:<11}{pct(m['acc']):>7}{pct(m['em']):>7}{pct(m['f1']):>7}{m.get('avg_retrievals') or 0:>6.2f}"
            f"{pct(m['answered']):>10}"
            f"{m['avg_steps']:>7.2f}{m['avg_docs']:>7.1f}{pct(m['recall']):>8}{pct(m['full_recall']):>7}"
        )
    from r3_env.train.metrics import read_metrics

    ppo = [row for row in read_metrics(demo.out / "train") if row["stage"] == "ppo"]
    if ppo:
        lines.append(
            f"  PPO training reward: {ppo[0]['reward']:.3f} (iteration 1) -> {ppo[-1]['reward']:.3f} "
            f"(iteration {ppo[-1]['step']}); correct {pct(ppo[0]['correct'])}% -> {pct(ppo[-1]['correct'])}%"
        )
    lines.append("  time: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in demo.stages.items()))
    lines.append(f"  total {sum(demo.stages.values()):.0f} s")
    lines.append("  where everything is:")
    for key, path in demo.paths.items():
        lines.append(f"    {key:<16}{path}")
    lines.append(f"  open {demo.paths.get('report', demo.out / 'report.html')} in a browser")
    return "\n".join(lines)
