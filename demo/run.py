"""``r3rag demo``: the whole pipeline on one machine, on the embedded default, in minutes on CPU.

In order: a synthetic world; its BM25 index; the retrieval service and the reward server (lexical
judge) as real local processes on free ports; cold-start trajectories from the world's scripted
teacher (Algorithm 1) and SFT data (Algorithm 2); the policy (by default a tiny one from the
model factory; ``--model smollm2-135m-instruct`` a real instruct model, with its own recipe);
evaluation of the untrained policy; SFT; evaluation; RL (the recipe's: PPO with a critic and GAE for R3-RAG,
without a critic for a pre-trained model on CPU); evaluation; and ``report.html`` with the before/after table,
the training curves and the trajectory browser.

``--data DIR`` (a folder of FlashRAG samples such as ``../shared/data``) runs the same stages on real
questions instead of the world: one BM25 index over the union of the samples' paragraphs, a fixed
split by question id (:mod:`r3_env.real_data`), cold start from the datasets' own evidence chains
(the evidence teacher) on the train part, RL on the train part under the real-question recipe's own settings
and episode rules (``REAL.rl``: the design measured in docs/results.md), evaluation on the eval part.

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

from demo.services import ServiceProcess, VLLMServer, vllm_cpu_env
from demo.settings import (
    ENV,
    MAX_MODEL_LEN,
    METHODS,
    MODEL,
    PRETRAINED,
    REAL,
    REAL_ENV,
    TINY,
    Budget,
    Method,
    ModelRecipe,
)

logger = logging.getLogger(__name__)

DEMO_FILE = "demo.json"
# the settings a demo.json recorded before they existed, at the values those runs had
RECORD_DEFAULTS = {"model": "tiny-random", "recipe": "r3", "scheme": "", "lora_rank": 0, "question_docs": 0,
                   "sft_lr": 0.0, "actor_lr": 0.0, "data": "", "eval_engine": "hf", "rollout_engine": "hf",
                   "vllm_python": ""}  # fmt: skip


@dataclass(frozen=True)
class DemoConfig:
    out: str = field(default="demo_out", metadata={"help": "folder for everything the demo writes"})
    model: str = field(
        default="smollm2-135m-instruct",
        metadata={
            "help": "the policy: smollm2-135m-instruct (a real instruct model, r3rag model list), tiny-random (a "
            "1.3M-parameter random model from the model factory, for path checks), or a local HF model folder"
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
        default=-1,
        metadata={
            "help": "SFT trains the policy through LoRA adapters of this rank (0: full fine-tuning; -1: the model "
            "recipe's, 16 on real questions and full on the world)"
        },
    )
    eval_questions: int = field(
        default=0, metadata={"help": "override the budget's dev questions per dataset (0: keep)"}
    )
    question_docs: int = field(
        default=-1,
        metadata={
            "help": "retrieve this many documents with the question and show them with it before the first step, in "
            "cold start, RL and evaluation alike (env.question_docs; 0: the policy's queries retrieve everything; "
            "-1: the model recipe's, 4 on real questions and 0 on the world)"
        },
    )
    sft_lr: float = field(default=0.0, metadata={"help": "override the recipe's SFT learning rate (0: keep)"})
    actor_lr: float = field(default=0.0, metadata={"help": "override the recipe's PPO actor learning rate (0: keep)"})
    data: str = field(
        default="",
        metadata={
            "help": "train and evaluate on real questions: a folder with one FlashRAG sample per dataset (DATASET/"
            "dev.jsonl and DATASET/corpus.jsonl, e.g. ../shared/data), split by question id ('': the synthetic world)"
        },
    )
    eval_engine: str = field(
        default="auto",
        metadata={
            "help": "engine of the evaluations: hf (transformers, in this process), vllm (vLLM's CPU or GPU build "
            "in --vllm_python's env, bash scripts/setup_vllm.sh) or auto (vllm for a pre-trained model's full run, "
            "hf for the tiny model and --quick, where vLLM's start costs more than it saves)"
        },
    )
    rollout_engine: str = field(
        default="auto",
        metadata={
            "help": "engine of the RL rollouts: hf (generate in the trainer), vllm (a vLLM server from "
            "--vllm_python's env, the actor's weights reloaded into it after each update) or auto (as eval_engine)"
        },
    )
    vllm_python: str = field(
        default=".venv-vllm/bin/python",
        metadata={"help": "eval_engine or rollout_engine vllm: the Python of an env with vLLM and r3rag"},
    )

    def __post_init__(self) -> None:
        from r3_env.model_registry import MODELS
        from r3_env.train.model_factory import FACTORY_FILE

        counts = (self.threads, self.sft_epochs, self.ppo_iterations, self.eval_questions)
        if min(counts) < 0 or min(self.lora_rank, self.question_docs) < -1:
            raise ValueError("threads and the overrides must be 0 or more (lora_rank and question_docs: -1, the "
                             "model recipe's, or more)")  # fmt: skip
        if self.sft_lr < 0 or self.actor_lr < 0:
            raise ValueError("sft_lr and actor_lr must be 0 (keep the recipe's) or positive")
        for name in ("eval_engine", "rollout_engine"):
            if getattr(self, name) not in ("hf", "vllm", "auto"):
                raise ValueError(f"{name}: {getattr(self, name)!r} is not hf, vllm or auto")
            if getattr(self, name) == "auto":
                tiny = self.model == "tiny-random" or (Path(self.model) / FACTORY_FILE).is_file()
                object.__setattr__(self, name, "hf" if tiny or self.quick else "vllm")
        used = "vllm" in (self.eval_engine, self.rollout_engine)
        if used and not Path(self.vllm_python).is_file():
            raise ValueError(
                f"vllm_python: {self.vllm_python} does not exist; run `bash scripts/setup_vllm.sh` (vLLM's CPU build) "
                "or pass --vllm_python PYTHON of an env with vLLM and r3rag, or set eval_engine and rollout_engine hf"
            )
        # where the vLLM env lives is no setting of the run: recorded only when it is used
        object.__setattr__(self, "vllm_python", str(Path(self.vllm_python).absolute()) if used else "")
        if self.data:
            if not Path(self.data).is_dir():
                raise ValueError(f"data: {self.data} is not a folder of FlashRAG samples (e.g. ../shared/data)")
            if self.model == "tiny-random":
                raise ValueError(
                    "model: tiny-random is the synthetic world's (its tokenizer is trained on the world); with --data "
                    "pass a pre-trained model: --model smollm2-135m-instruct or a local HF folder"
                )
            if self.recipe != "r3":
                raise ValueError("data: real questions run the r3 recipe (the evidence teacher writes r3 steps)")
            object.__setattr__(self, "data", str(Path(self.data).resolve()))
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
        for name in ("lora_rank", "question_docs"):  # recorded as resolved, so a rerun compares what ran
            if getattr(self, name) == -1:
                object.__setattr__(self, name, getattr(self.model_recipe, name))
        rl_layers = self.model_recipe.rl.get("model.trainable_layers", 0)
        if rl_layers and self.model not in MODELS:  # said now, not after SFT (a registry model has enough)
            layers = json.loads((Path(self.model) / "config.json").read_text()).get("num_hidden_layers", rl_layers)
            if layers < rl_layers:
                raise ValueError(
                    f"model: {self.model} has {layers} decoder layers, and the RL stage on real questions trains the "
                    f"last {rl_layers} (REAL.rl in demo/settings.py): pass a model with {rl_layers} or more"
                )

    @property
    def method(self) -> Method:
        return METHODS[self.recipe]

    @property
    def model_recipe(self) -> ModelRecipe:
        """TINY for the factory's models (by name, or a folder it wrote), PRETRAINED for the rest."""
        from r3_env.train.model_factory import FACTORY_FILE

        factory_made = self.model == "tiny-random" or (Path(self.model) / FACTORY_FILE).is_file()
        return TINY if factory_made else REAL if self.data else PRETRAINED

    @property
    def budget(self) -> Budget:
        budget = self.model_recipe.quick if self.quick else self.model_recipe.full
        overrides = {
            key: getattr(self, key) for key in ("sft_epochs", "ppo_iterations", "eval_questions") if getattr(self, key)
        }
        return dataclasses.replace(budget, **overrides)


@dataclass(frozen=True)
class DemoData:
    """What a demo retrieves from, trains on and evaluates on (``coldstart`` and ``eval``: comma-separated files)."""

    corpus: Path
    coldstart: str
    prompts: Path
    eval: str
    teacher: str  # the cold-start teacher: scripted (the world's) or evidence (the datasets' annotations)


class Demo:
    def __init__(self, config: DemoConfig) -> None:
        self.config = config
        self.budget = config.budget
        self.out = Path(config.out)
        self.stages: dict[str, float] = {}
        self.earlier_stages: list[dict[str, float]] = []  # the stage times of the runs this one resumes, oldest first
        self.paths: dict[str, Path] = {}
        self.urls: dict[str, str] = {}
        self.data: DemoData | None = None  # set by the first stage
        self.differences: dict[str, dict[str, float]] = {}  # EM of one policy minus another's, paired CI
        self.recall_differences: dict[str, dict[str, float]] = {}  # the same in Full-Recall (real questions)

    @classmethod
    def from_folder(cls, out: str | Path, **overrides: Any) -> tuple[Demo, dict[str, Any]]:
        """The demo recorded in ``out``'s demo.json, with ``overrides`` of its settings, and the record itself.

        For benches that build on a finished demo (its SFT policy, services and evaluation)."""
        path = Path(out) / DEMO_FILE
        if not path.is_file():
            raise ValueError(f"{path} is missing: give the --out folder of an `r3rag demo` run")
        record = json.loads(path.read_text())
        return cls(DemoConfig(**{**RECORD_DEFAULTS, **record["config"], **overrides})), record

    @contextmanager
    def stage(self, name: str, title: str) -> Iterator[None]:
        logger.info("== %s", title)
        started = time.perf_counter()
        yield
        self.stages[name] = round(time.perf_counter() - started, 1)
        plan = self.plan() if self.data else {}
        if name not in plan:
            logger.info("== %s: %.1f s", title, self.stages[name])
            return
        done = {*self.stages, "prepare"}  # prepare's stages are timed on their own; its estimate is spent
        left = sum(seconds for stage, (seconds, _) in plan.items() if stage not in done)
        logger.info(
            "== %s: %.0f s (planned %.0f); about %s to go, done about %s",
            title, self.stages[name], plan[name][0], _minutes(left), _clock(left),
        )  # fmt: skip

    def plan(self) -> dict[str, tuple[float, str]]:
        """The stages from the evaluation of the untrained policy on: estimated seconds on 2 CPU cores (the model
        recipe's costs) and what each does. ``prepare``, everything before, is done when the SFT data is."""
        assert self.data is not None, "the plan needs the demo's data (sources() first)"
        costs, budget = self.config.model_recipe.costs, self.budget
        sft_data = self.paths.get("sft_data")
        if sft_data is not None and sft_data.is_file():
            examples = _count_lines(sft_data)
        else:
            asked = sum(_count_lines(Path(name)) for name in self.data.coldstart.split(","))
            examples = round(costs.sft_keep * min(asked, budget.coldstart_questions or asked))
        questions = _questions_asked(self.data.eval, budget.eval_questions)
        episodes = budget.ppo_iterations * budget.rollout_batch_size * budget.n_samples_per_prompt
        # the costs are vLLM's; HF generate starts at once and generates about 4x slower (docs/benchmarks.md)
        vllm = self.config.eval_engine == "vllm"
        start, per_question = (costs.eval_start_s, 1.0) if vllm else (0.0, 4.0)
        evaluation = start + questions * costs.eval_question_s * per_question
        plan = {
            "prepare": (costs.prepare_s, "world, index, services, cold start, model, SFT data"),
            "eval_untrained": (
                start + questions * costs.untrained_question_s * per_question,
                f"evaluate the untrained policy on {questions} {'eval' if self.config.data else 'dev'} questions",
            ),
            "sft": (
                examples * budget.sft_epochs * costs.sft_example_s,
                f"SFT: {examples} examples x {budget.sft_epochs} epochs",
            ),
            "eval_sft": (evaluation, "evaluate the SFT policy"),
            "ppo": (
                (costs.rl_start_s if self.config.rollout_engine == "vllm" else 0.0) + episodes * costs.rl_episode_s,
                f"RL: {budget.ppo_iterations} iterations, {episodes} episodes",
            ),
            "eval_ppo": (evaluation, "evaluate the RL policy"),
        }
        if self.config.method.no_retrieval_eval:
            plan["eval_ppo_direct"] = (evaluation, "evaluate the RL policy answering without retrieval")
        return plan

    def log_plan(self) -> None:
        plan = self.plan()
        total = sum(seconds for seconds, _ in plan.values())
        logger.info(
            "plan (estimates for 2 CPU cores; %s, %s recipe): about %s, done about %s",
            self.config.model, self.config.recipe, _minutes(total), _clock(total),
        )  # fmt: skip
        for name, (seconds, what) in plan.items():
            logger.info("  %-16s %7s  %s", name, _minutes(seconds), what)

    def check_folder(self, overwrite: bool) -> None:
        """Refuse to mix two demos' settings in one folder (a rerun of the same one resumes)."""
        record = self.out / DEMO_FILE
        if not record.is_file():
            return
        recorded = json.loads(record.read_text())
        previous = {**RECORD_DEFAULTS, **(recorded.get("config") or {})}
        # the budget too: a recipe's budget may change under the same flags (--data's SFT epochs did)
        budget = recorded.get("budget") or dataclasses.asdict(self.budget)
        if previous == dataclasses.asdict(self.config) and budget == dataclasses.asdict(self.budget):
            # a resumed stage takes seconds: keep each earlier run's times, not just the last one's
            earlier = [*recorded.get("earlier_stages_s", []), recorded.get("stages_s") or {}]
            self.earlier_stages = [stages for stages in earlier if stages]
            return
        if not overwrite:
            raise ValueError(
                f"{self.out} holds a demo run with other settings or budget: pass --out DIR for this one, or "
                "--overwrite"
            )
        shutil.rmtree(self.out)

    def write_record(self, results: dict[str, Any]) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        record = {
            "config": dataclasses.asdict(self.config),
            "budget": dataclasses.asdict(self.budget),
            "stages_s": self.stages,
            "earlier_stages_s": self.earlier_stages,
            "paths": {key: str(path) for key, path in self.paths.items()},
            "services": self.urls,
            "results": results,
            "differences": self.differences,
            "full_recall_differences": self.recall_differences,
        }
        (self.out / DEMO_FILE).write_text(json.dumps(record, indent=2) + "\n")

    # -- stages ---------------------------------------------------------------------------------

    @property
    def env(self) -> dict[str, Any]:
        """The episode's rules of the cold start and of SFT."""
        env = REAL_ENV if self.config.data else ENV
        return {**env, "question_docs": self.config.question_docs} if self.config.question_docs else env

    @property
    def rl_env(self) -> dict[str, Any]:
        """The episode's rules of RL and of every evaluation: the cold start's, with the model recipe's RL ``env.*``
        settings (the transcripts SFT learns from were written under the cold start's)."""
        rl = self.config.model_recipe.rl
        return {**self.env, **{key.split(".", 1)[1]: value for key, value in rl.items() if key.startswith("env.")}}

    @property
    def rl_run(self) -> Path:
        """The run folder of the RL stage: the SFT run's, or its own where the model recipe gives RL settings."""
        return self.out / "rl" if self.config.model_recipe.rl else self.out / "train"

    def rl_settings(self) -> dict[str, Any]:
        """The model recipe's RL settings over the SFT run's, with this demo's --actor_lr and --scheme over them;
        PPO-ptx's data is the demo's own SFT data."""
        rl = dict(self.config.model_recipe.rl)
        if self.config.scheme:  # an ablation's scheme runs with its own options, the rest equal
            rl = {key: value for key, value in rl.items() if key not in ("reward.scheme", "reward.options")}
        if self.config.actor_lr:
            rl["ppo.actor_lr"] = self.config.actor_lr
        if rl.get("ppo.ptx_coef"):
            rl["ppo.ptx_data"] = str(self.sft_data_file)
        return rl

    @property
    def sft_data_file(self) -> Path:
        """The SFT examples built from the cold start's trajectories (Algorithm 2)."""
        return self.out / "coldstart" / "sft.jsonl"

    def sources(self) -> DemoData:
        """The synthetic world, or the real samples of ``--data`` split by question id."""
        if self.config.data:
            from r3_env.real_data import prepare_real_data

            with self.stage("data", "1. real questions: one corpus, split by question id"):
                real = prepare_real_data(Path(self.config.data), self.out / "data")
            self.paths["data"] = real.root
            self.data = DemoData(real.corpus, real.data("train"), real.prompts, real.data("eval"), "evidence")
            return self.data
        from r3_env.world.build import WorldConfig, generate_world

        folder = self.out / "world"
        with self.stage("world", "1. synthetic world"):
            generate_world(WorldConfig(entities=self.budget.entities, seed=self.config.seed), folder)
        self.paths["world"] = folder
        train = folder / "train.jsonl"
        self.data = DemoData(folder / "corpus.jsonl", str(train), train, str(folder / "dev.jsonl"), "scripted")
        return self.data

    def index(self, data: DemoData) -> Path:
        from r3_env.retrieval.index_builder import IndexBuildConfig, build_index

        with self.stage("index", "2. BM25 index"):  # rebuilt every run: seconds at these sizes
            config = IndexBuildConfig(corpus_path=str(data.corpus), save_dir=str(self.out / "index"))
            index = build_index(config)
        self.paths["index"] = index
        return index

    def services(self, data: DemoData, index: Path) -> tuple[ServiceProcess, ServiceProcess]:
        folder = self.out / "services"
        folder.mkdir(parents=True, exist_ok=True)
        retriever_yaml = folder / "retriever.yaml"
        retriever_yaml.write_text(
            yaml.safe_dump({"retrieval_method": "bm25", "index_path": str(index), "corpus_path": str(data.corpus)})
        )
        reward_yaml = folder / "reward.yaml"
        reward_yaml.write_text(yaml.safe_dump({"judge": {"backend": "lexical"}}))
        retriever = ServiceProcess(
            ["retriever", "serve", "--config", str(retriever_yaml)], log=folder / "retriever.log"
        )
        reward = ServiceProcess(["reward", "serve", "--config", str(reward_yaml)], log=folder / "reward.log")
        self.paths["services"] = folder
        return retriever, reward

    def coldstart(self, data: DemoData, retriever_url: str) -> Path:
        from r3_env.coldstart.synth import SynthConfig, synthesize
        from r3_env.coldstart.teacher import TeacherConfig
        from r3_env.env import EnvConfig
        from r3_env.runs import RetrievalSource

        folder = self.out / "coldstart"
        with self.stage("coldstart", f"4. cold-start trajectories ({data.teacher} teacher, Algorithm 1)"):
            config = SynthConfig(
                data=data.coldstart,
                out=str(folder),
                samples=1,
                max_questions=self.budget.coldstart_questions,
                step_format=self.config.method.step_format,
            )
            asyncio.run(
                synthesize(
                    config, EnvConfig(**self.env), TeacherConfig(kind=data.teacher), RetrievalSource(url=retriever_url)
                )
            )
        self.paths["coldstart"] = folder
        return folder / "trajectories.jsonl"

    def policy(self) -> Path:
        from r3_env.model_registry import MODELS, get_model
        from r3_env.train.model_factory import TinyModelConfig, build_tiny_policy

        model, folder = self.config.model, self.untrained_policy
        if model == "tiny-random":
            with self.stage("model", "5a. tiny policy (BPE tokenizer on the world, random Qwen2)"):
                sizes = TinyModelConfig(**MODEL, seed=self.config.seed, step_format=self.config.method.step_format)
                build_tiny_policy(self.paths["world"], folder, sizes)
        elif model in MODELS:
            with self.stage("model", f"5a. {model} (r3rag model get)"):
                get_model(model, folder)
        else:
            with self.stage("model", f"5a. the policy in {folder}"):
                pass
        self.paths["policy0"] = folder
        return folder

    @property
    def untrained_policy(self) -> Path:
        """Where the untrained policy is (or will be): OUT/policy0 for a built or registry model, else its folder."""
        from r3_env.model_registry import MODELS

        built = self.config.model == "tiny-random" or self.config.model in MODELS
        return self.out / "policy0" if built else Path(self.config.model)

    def sft_data(self, trajectories: Path, policy: Path) -> Path:
        from r3_env.coldstart.sft_data import SFTDataConfig, build_sft_data

        out = self.sft_data_file
        self.paths["sft_data"] = out
        with self.stage("sft_data", "5b. SFT data (Algorithm 2)"):
            if not out.is_file():
                build_sft_data(
                    SFTDataConfig(
                        input=str(trajectories),
                        out=str(out),
                        tokenizer=str(policy),
                        doc_chars=self.env["doc_chars"],
                        step_format=self.config.method.step_format,
                    )
                )
        return out

    def train_config(
        self, policy: Path, sft_data: Path | str, prompts: Path, retriever_url: str, reward_url: str
    ) -> Any:
        """The local trainer's settings for this demo (``sft_data`` empty: PPO only, from ``policy``)."""
        from r3_env.config import configs_from_values
        from r3_env.train.config import SECTIONS
        from r3_env.train.local import LocalTrainConfig

        budget, method, recipe = self.budget, self.config.method, self.config.model_recipe
        reward = method.reward
        if self.config.scheme and self.config.scheme != reward["scheme"]:  # an ablation: its own options
            reward = {"scheme": self.config.scheme, "placement": reward["placement"]}
        switch = method.switch_at(budget.ppo_iterations)
        if switch is not None and reward["scheme"] == method.reward["scheme"]:
            from r3_env.model_registry import offline_minilm_path

            options = {**reward["options"], "switch_step": switch}
            reward.update(options=options, query_encoder=offline_minilm_path())
        scale = recipe.lora_lr_scale if self.config.lora_rank else 1.0
        sft = {**recipe.sft, "lr": self.config.sft_lr or scale * recipe.sft["lr"]}
        ppo = {**recipe.ppo, "actor_lr": self.config.actor_lr or scale * recipe.ppo["actor_lr"]}
        values = {
            "out": str(self.out / "train"),
            "seed": self.config.seed,
            "threads": self.config.threads,
            # LoRA is the other way to train part of the model: it replaces the recipe's trainable layers
            "model": {**recipe.model, "policy": str(policy), "lora_rank": self.config.lora_rank}
            | ({"trainable_layers": 0} if self.config.lora_rank else {}),
            "sft": {"data": str(sft_data), "epochs": budget.sft_epochs, **sft},
            "ppo": {
                "prompts": str(prompts),
                "iterations": budget.ppo_iterations,
                "rollout_batch_size": budget.rollout_batch_size,
                "n_samples_per_prompt": budget.n_samples_per_prompt,
                "max_len": 3072,
                **ppo,
                **method.trainer_ppo,
            },
            "env": self.env,
            "reward": reward,
            "policy": {"step_format": method.step_format},
            "services": {"retriever_url": retriever_url, "reward_url": reward_url},
        }
        return LocalTrainConfig.from_sections(*configs_from_values(values, SECTIONS, where="demo"))

    def evaluate(
        self,
        name: str,
        policy: Path,
        data: str,
        retriever: str,
        reward: str,
        eval_method: str = "r3",
        env: dict[str, Any] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Run ``eval_method`` with ``policy`` on ``data`` (comma-separated files) and score it.

        ``env``: the episode's rules (default: the demo's). ``extra``: more :class:`eval.run.EvalRunConfig`
        settings (``naive_topk`` for the baselines).
        """
        from eval.score import ScoreConfig, score_run
        from r3_env.runs import JudgeClientConfig

        folder = self.out / "eval" / name
        settings = {
            "data": data,
            "out": str(folder),
            "name": name,
            "max_questions": self.budget.eval_questions,
            "concurrency": 32,
            "step_format": self.config.method.step_format,
            "method": eval_method,
            **extra,
        }
        self.run_episodes(settings, policy, retriever, env or self.rl_env)
        scores = asyncio.run(score_run(ScoreConfig(run=str(folder)), JudgeClientConfig(url=reward)))
        self.paths[f"eval_{name}"] = folder
        return scores

    def run_episodes(
        self,
        settings: dict[str, Any],
        policy: Path,
        retriever: str,
        env: dict[str, Any],
        generation: dict[str, Any] | None = None,
    ) -> None:
        """``r3rag eval run`` of ``policy`` on the demo's evaluation engine: vLLM's CPU build in its own env, or HF
        generate here. ``settings``: :class:`eval.run.EvalRunConfig`'s; ``env``: the episode's rules;
        ``generation``: :class:`eval.engines.GenerationConfig`'s (greedy when not given)."""
        generation = generation or {}
        if self.config.eval_engine == "vllm":
            flags = {f"generation.{key}": value for key, value in generation.items()}
            self._evaluate_in_vllm_env({**settings, **flags}, policy, retriever, env)
            return
        from eval.engines import EngineConfig, GenerationConfig
        from eval.run import EvalRunConfig, run_eval
        from r3_env.env import EnvConfig
        from r3_env.runs import RetrievalSource

        engine = EngineConfig(kind="hf", model=str(policy), dtype="float32", max_model_len=MAX_MODEL_LEN)
        asyncio.run(
            run_eval(
                EvalRunConfig(**settings), EnvConfig(**env), engine, GenerationConfig(**generation),
                RetrievalSource(url=retriever),
            )
        )  # fmt: skip

    def _evaluate_in_vllm_env(
        self, settings: dict[str, Any], policy: Path, retriever: str, env: dict[str, Any]
    ) -> None:
        """``r3rag eval run --engine.kind vllm`` in the vLLM env, with vLLM's CPU settings (:func:`vllm_cpu_env`);
        ``env``: the episode's rules."""
        import os
        import subprocess

        from eval.run import PREDICTIONS

        flags = [f"--{key}={value}" for key, value in settings.items()]
        flags += [f"--env.{key}={value}" for key, value in env.items() if not isinstance(value, bool)]
        flags += [f"--{'' if value else 'no-'}env.{key}" for key, value in env.items() if isinstance(value, bool)]
        engine = ["--engine.kind=vllm", f"--engine.model={policy}", "--engine.dtype=float32", "--engine.enforce_eager",
                  f"--engine.max_model_len={MAX_MODEL_LEN}", f"--retrieval.url={retriever}"]  # fmt: skip
        command = [self.config.vllm_python, "-m", "r3_env.cli", "-q", "eval", "run", *flags, *engine]
        log = Path(settings["out"]).with_suffix(".vllm.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {**vllm_cpu_env(), **os.environ}
        total = _questions_asked(settings["data"], settings["max_questions"])
        with open(log, "a") as handle:
            process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env)
            returncode = _follow(process, Path(settings["out"]) / PREDICTIONS, total, f"eval {settings['name']} (vLLM)")
        if returncode != 0:
            raise RuntimeError(f"the vLLM evaluation failed (exit {returncode}); its log: {log}")

    def train_ppo(self, config: Any, start: Path) -> Path:
        """PPO from ``start`` (resumes); with ``--rollout_engine vllm`` its rollouts come from a vLLM server of an
        untied copy of ``start`` that the trainer reloads with the actor's weights (its log: RUN/rollout_vllm.log)."""
        from r3_env.train.local import train_local
        from r3_env.train.models import finished

        run = Path(config.run.out)
        if self.config.rollout_engine == "hf" or finished(run / "ppo"):
            return train_local(config)["ppo"]
        from transformers import AutoModelForCausalLM

        from r3_env.train.models import load_tokenizer, save_policy

        # the trainer reloads the actor into the served model in place: serve it untied (save_policy says why)
        model = AutoModelForCausalLM.from_pretrained(start)
        served = save_policy(model, load_tokenizer(str(start)), run / "ppo" / "rollout_policy", untied=True)
        del model
        log = run / "rollout_vllm.log"
        with VLLMServer(self.config.vllm_python, str(served), log=log, reloadable=True) as server:
            logger.info("PPO rollouts from vLLM at %s (log: %s)", server.url, log)
            ppo = dataclasses.replace(config.ppo, vllm_url=server.url)
            return train_local(dataclasses.replace(config, ppo=ppo))["ppo"]

    def finished_sft_policy(self) -> Path:
        """The SFT policy of this demo's folder; a ValueError when SFT has not finished there."""
        sft_policy = self.out / "train" / "sft" / "policy"
        if not (sft_policy / "config.json").is_file():
            raise ValueError(f"{self.out} has no SFT policy yet ({sft_policy}): let its demo run finish first")
        return sft_policy

    def ppo_again(self, settings: dict[str, Any], out: Path, urls: tuple[str, str], start: Path | None = None) -> Path:
        """PPO from ``start`` (default: this finished demo's SFT policy) into ``out`` (resumes), with the dotted
        ``r3rag train local`` settings given changed and the rest the demo's: the policy it ends with."""
        start = start or self.finished_sft_policy()
        data = self.data or self.sources()
        config = self.train_config(start, "", data.prompts, *urls)  # PPO only, from the start
        return self.train_ppo(config.with_settings({**self.rl_settings(), **settings, "out": str(out)}), start)

    @contextmanager
    def serving(self) -> Iterator[tuple[str, str]]:
        """A finished run's retrieval service and reward server, started again: (retriever URL, reward URL)."""
        services = self.out / "services"
        with (
            ServiceProcess(["retriever", "serve", "--config", str(services / "retriever.yaml")]) as retriever,
            ServiceProcess(["reward", "serve", "--config", str(services / "reward.yaml")]) as reward,
        ):
            yield retriever.url, reward.url

    def compare(self, pairs: tuple[tuple[str, str], ...], metric: str = "em") -> dict[str, dict[str, float]]:
        """``metric`` of each (policy, baseline) evaluated here, minus the baseline's on the same questions, with
        its paired bootstrap 95% CI, keyed "policy - baseline"."""
        from eval.compare import compare_runs, question_set

        assert self.data is not None
        questions = question_set(self.data.eval, self.budget.eval_questions)
        return {
            f"{arm} - {base}": compare_runs(
                self.paths[f"eval_{arm}"], self.paths[f"eval_{base}"], questions, metric=metric
            )
            for arm, base in pairs
        }

    @property
    def rl_title(self) -> str:
        """The RL stage as the log names it: the method's, or without a critic where the model recipe drops it."""
        recipe = self.config.model_recipe
        estimator = recipe.rl.get("ppo.estimator", recipe.ppo.get("estimator"))
        if self.config.method.recipe != "r3" or estimator not in ("reinforce", "group_norm"):
            return self.config.method.title
        rewards = "one reward per episode" if recipe.rl.get("reward.placement") == "scalar" else "per-step rewards"
        if estimator == "reinforce":
            return f"PPO with REINFORCE++ returns (no critic, {rewards})"
        return f"PPO with group-normalised advantages (no critic, {rewards})"

    # -- the whole pipeline -----------------------------------------------------------------------

    def run(self, overwrite: bool = False) -> dict[str, Any]:
        from eval.report import write_report
        from r3_env.train.local import train_local

        self.check_folder(overwrite)
        self.out.mkdir(parents=True, exist_ok=True)
        self.write_record({})
        data = self.sources()
        self.log_plan()
        index = self.index(data)
        retriever, reward = self.services(data, index)
        results: dict[str, Any] = {}
        try:  # the services stop however this ends: an error, Ctrl-C or SIGTERM (see stop_services_on_sigterm)
            with self.stage("services", "3. retrieval service and reward server (local processes)"):
                retriever.start()
                reward.start()
            self.urls = {"retriever": retriever.url, "reward": reward.url}
            logger.info(
                "retrieval service %s, reward server %s (logs in %s)", retriever.url, reward.url, self.paths["services"]
            )
            trajectories = self.coldstart(data, retriever.url)
            policy0 = self.policy()
            sft_data = self.sft_data(trajectories, policy0)
            config = self.train_config(policy0, sft_data, data.prompts, retriever.url, reward.url)
            urls = (retriever.url, reward.url)
            with self.stage("eval_untrained", "6a. evaluate the untrained policy"):
                results["untrained"] = _summary(self.evaluate("untrained", policy0, data.eval, *urls))
            with self.stage("sft", "6b. SFT on the cold-start data"):
                sft_policy = train_local(config, stages=("sft",))["sft"]
            with self.stage("eval_sft", "7. evaluate the SFT policy"):
                results["sft"] = _summary(self.evaluate("sft", sft_policy, data.eval, *urls))
            with self.stage("ppo", f"8. {self.rl_title} from the SFT policy"):
                if self.config.model_recipe.rl:  # RL's own settings: a run of its own, from the SFT policy
                    ppo_policy = self.ppo_again({}, self.rl_run, urls, sft_policy)
                else:
                    ppo_policy = self.train_ppo(config, sft_policy)
            with self.stage("eval_ppo", "9. evaluate the PPO policy"):
                results["ppo"] = _summary(self.evaluate("ppo", ppo_policy, data.eval, *urls))
            self.differences = self.compare((("sft", "untrained"), ("ppo", "untrained"), ("ppo", "sft")))
            if self.config.data:  # what RL raises on real questions: documents found (docs/results.md)
                self.recall_differences = self.compare((("ppo", "sft"),), metric="full_recall")
            if self.config.method.no_retrieval_eval:
                with self.stage("eval_ppo_direct", "9b. evaluate the PPO policy answering without retrieval"):
                    scores = self.evaluate("ppo_direct", ppo_policy, data.eval, *urls, eval_method="direct")
                    results["ppo_direct"] = _summary(scores)
        finally:
            retriever.stop()
            reward.stop()
        with self.stage("report", "10. report"):
            learned = ("untrained", "sft", "ppo")  # the page opens with one question answered by each
            runs = dict.fromkeys((self.out / "train", self.rl_run))  # SFT's run, then RL's where it has its own
            paths = write_report(self.out / "eval", self.out, training=list(runs), learned=learned)
        self.paths.update(report=paths["html"], train=self.out / "train", sft_policy=sft_policy, ppo_policy=ppo_policy)
        if self.config.model_recipe.rl:
            self.paths["rl"] = self.rl_run
        self.write_record(results)
        return results


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _clock(seconds_from_now: float) -> str:
    return time.strftime("%H:%M", time.localtime(time.time() + seconds_from_now))


def _count_lines(path: Path) -> int:
    if not path.is_file():
        return 0
    with open(path, "rb") as handle:
        return sum(1 for _ in handle)


def _questions_asked(data: str, per_dataset: int) -> int:
    """The questions an evaluation asks of ``data`` (comma-separated files): the first ``per_dataset`` of each
    (0: all), as ``r3rag eval run --max_questions`` takes them."""
    return sum(min(_count_lines(Path(name)), per_dataset or 10**9) for name in data.split(","))


def _follow(process: Any, predictions: Path, total: int, desc: str) -> int:
    """Wait for an evaluation in another process, showing the rows it appends to ``predictions`` (with an ETA);
    its exit status."""
    from tqdm import tqdm

    with tqdm(total=total, initial=min(_count_lines(predictions), total), desc=desc, unit=" questions") as bar:
        while process.poll() is None:
            time.sleep(2.0)
            bar.update(min(_count_lines(predictions), total) - bar.n)
        bar.update(min(_count_lines(predictions), total) - bar.n)
    return process.returncode


def _questions(per_evaluation: int, real: bool) -> str:
    """How many questions an evaluation asks, in words (``per_evaluation`` 0: all)."""
    if not per_evaluation:
        return "every eval question" if real else "every dev question"
    return f"{per_evaluation} {'eval questions per dataset' if real else 'dev questions'}"


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
        f"{_questions(demo.budget.eval_questions, bool(demo.config.data))} per evaluation",
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

    if demo.differences:
        questions = next(iter(demo.differences.values()))["n"]
        for metric, pairs in (("EM", demo.differences), ("Full-Recall", demo.recall_differences)):
            if pairs:
                lines.append(f"  {metric} difference on the same {questions} questions (paired bootstrap 95% CI):")
            for pair, ci in pairs.items():
                mean, lo, hi = (100 * ci[key] for key in ("mean", "lo", "hi"))
                lines.append(f"    {pair:<18}{mean:+6.1f}  ({lo:+.1f} to {hi:+.1f})")
    ppo = [row for row in read_metrics(demo.rl_run) if row["stage"] == "ppo"]
    if ppo:
        lines.append(
            f"  PPO training reward: {ppo[0]['reward']:.3f} (iteration 1) -> {ppo[-1]['reward']:.3f} "
            f"(iteration {ppo[-1]['step']}); correct {pct(ppo[0]['correct'])}% -> {pct(ppo[-1]['correct'])}%"
        )
    lines.append("  time: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in demo.stages.items()))
    lines.append(f"  total {sum(demo.stages.values()):.0f} s")
    if demo.earlier_stages:
        lines.append(f"  (this run resumed {len(demo.earlier_stages)} earlier one(s): their times are in demo.json)")
    lines.append("  where everything is:")
    for key, path in demo.paths.items():
        lines.append(f"    {key:<16}{path}")
    lines.append(f"  open {demo.paths.get('report', demo.out / 'report.html')} in a browser")
    return "\n".join(lines)
