"""The local trainer's settings: one YAML file (or dotted flags) with the agent's sections beside its own.

``env:``, ``reward:``, ``services:`` and ``policy:`` are the agent's sections
(:class:`r3_env.rollout_config.RolloutConfig`, the same file ``launch/ppo_r3.sh`` gives the cluster run),
so a recipe's environment and reward are written once. ``model:``, ``sft:`` and ``ppo:`` are the
trainer's; their names and defaults follow OpenRLHF's flags where one exists (noted per field).
``health:`` sets when the PPO health monitor warns.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from r3_env.config import ConfigError
from r3_env.recipes import AGENT_SECTIONS, AlgoSection, json_object, load_recipe
from r3_env.rollout_config import SECTIONS as ROLLOUT_SECTIONS


@dataclass(frozen=True)
class RunConfig:
    out: str = field(default="runs/train", metadata={"help": "run folder: checkpoints, metrics, final policies"})
    seed: int = field(default=0, metadata={"help": "seed for sampling, shuffling and initialisation"})
    device: Literal["auto", "cpu", "cuda"] = field(default="auto", metadata={"help": "auto: cuda when available"})
    threads: int = field(default=0, metadata={"help": "torch CPU threads (0: torch's default)"})
    save_every: int = field(default=5, metadata={"help": "PPO iterations between checkpoints (the last is kept)"})

    def __post_init__(self) -> None:
        if self.threads < 0 or self.save_every < 1:
            raise ValueError("threads must be 0 or more and save_every at least 1")


@dataclass(frozen=True)
class ModelConfig:
    policy: str = field(
        default="", metadata={"help": "policy: an HF folder or hub name (r3rag train model builds one)"}
    )
    critic: str = field(
        default="", metadata={"help": "critic's initial weights (default: the policy's, new value head)"}
    )
    dtype: Literal["fp32", "bf16"] = field(default="fp32", metadata={"help": "parameter dtype (fp32 on CPU)"})
    attn_implementation: str = field(default="sdpa", metadata={"help": "sdpa, eager or flash_attention_2 (GPU)"})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "trade compute for memory (large models)"})
    mixed_precision: Literal["no", "bf16", "auto"] = field(
        default="no",
        metadata={
            "help": "bf16: compute under torch.autocast with fp32 weights and optimizer (2.08x faster SFT steps "
            "for SmolLM2 on AVX512-BF16 CPUs; bench/sft_speed.py). A CPU without native bf16 emulates it, "
            "and the trainer warns. auto: bf16 on a GPU or a CPU with native bf16, no elsewhere"
        },
    )
    trainable_layers: int = field(
        default=0,
        metadata={
            "help": "train only the last N decoder layers and the final norm, the rest frozen (0: all); backward "
            "stops at the first trained layer, so it saves compute where LoRA saves only optimizer memory"
        },
    )
    lora_rank: int = field(
        default=0, metadata={"help": "train the policy through LoRA adapters of this rank (0: full; --actor.lora_rank)"}
    )
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha (--actor.lora_alpha)"})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout (--actor.lora_dropout)"})
    target_modules: str = field(
        default="all-linear",
        metadata={"help": "modules LoRA adapts, comma-separated or all-linear (--actor.target_modules)"},
    )

    def __post_init__(self) -> None:
        if self.lora_rank < 0 or self.lora_alpha < 1 or not 0 <= self.lora_dropout < 1:
            raise ValueError("model.lora_rank must be 0 or more, lora_alpha at least 1, lora_dropout in [0, 1)")
        if self.trainable_layers < 0:
            raise ValueError("model.trainable_layers must be 0 (all) or more")
        if self.trainable_layers and self.lora_rank:
            raise ValueError("model.trainable_layers and model.lora_rank: choose one way to train part of the model")
        if not self.policy:
            raise ValueError("model.policy is required: an HF model folder or hub name (r3rag train model makes one)")


@dataclass(frozen=True)
class SFTConfig:
    data: str = field(default="", metadata={"help": "SFT .jsonl from r3rag coldstart sft-data (transcript form)"})
    epochs: int = field(default=3, metadata={"help": "passes over the data (OpenRLHF: --train.max_epochs)"})
    lr: float = field(default=5e-4, metadata={"help": "peak learning rate (OpenRLHF: --adam.lr)"})
    batch_size: int = field(default=8, metadata={"help": "examples per optimizer step"})
    micro_batch_size: int = field(default=8, metadata={"help": "examples per forward pass (gradients accumulate)"})
    max_len: int = field(default=4096, metadata={"help": "tokens per example; longer ones are truncated"})
    lr_warmup_ratio: float = field(default=0.03, metadata={"help": "warm-up share of the steps (cosine_with_min_lr)"})
    min_lr_ratio: float = field(default=0.1, metadata={"help": "final learning rate as a share of the peak"})
    max_norm: float = field(default=1.0, metadata={"help": "gradient clipping norm"})

    def __post_init__(self) -> None:
        if min(self.epochs, self.batch_size, self.micro_batch_size, self.max_len) < 1 or self.lr <= 0:
            raise ValueError("sft epochs, batch sizes and max_len must be at least 1, and lr positive")
        if self.batch_size % self.micro_batch_size:
            raise ValueError(f"sft.batch_size ({self.batch_size}) must divide by micro_batch_size")


@dataclass(frozen=True)
class PPOConfig:
    prompts: str = field(default="", metadata={"help": "FlashRAG dataset .jsonl of training questions"})
    iterations: int = field(default=10, metadata={"help": "rollout-then-update iterations"})
    rollout_batch_size: int = field(default=16, metadata={"help": "questions per iteration (--rollout.batch_size)"})
    n_samples_per_prompt: int = field(default=2, metadata={"help": "episodes per question"})
    micro_batch_size: int = field(default=8, metadata={"help": "episodes per forward pass"})
    train_batch_size: int = field(default=32, metadata={"help": "episodes per optimizer step (--train.batch_size)"})
    max_epochs: int = field(default=1, metadata={"help": "passes over each iteration's episodes"})
    actor_lr: float = field(default=2e-5, metadata={"help": "policy learning rate (--actor.adam.lr)"})
    critic_lr: float = field(default=1e-4, metadata={"help": "critic learning rate (--critic.adam.lr)"})
    estimator: Literal["gae", "reinforce", "group_norm"] = field(
        default="gae",
        metadata={
            "help": "advantages: gae (critic, the paper's PPO), reinforce (no critic) or group_norm (GRPO/DAPO: "
            "rewards normalised within each question's samples; needs reward.placement scalar)"
        },
    )
    gamma: float = field(default=1.0, metadata={"help": "discount (--algo.advantage.gamma)"})
    lambd: float = field(default=0.95, metadata={"help": "GAE lambda (--algo.advantage.lambd)"})
    init_kl_coef: float = field(default=0.01, metadata={"help": "KL penalty in the reward (--algo.kl.init_coef)"})
    kl_target: float = field(default=0.0, metadata={"help": "adaptive KL target; 0 keeps the coefficient fixed"})
    kl_horizon: int = field(default=10000, metadata={"help": "adaptive KL horizon (--algo.kl.horizon)"})
    kl_estimator: Literal["k1", "k2", "k3"] = field(default="k1", metadata={"help": "--algo.kl.estimator"})
    eps_clip: float = field(default=0.2, metadata={"help": "PPO ratio clip (--actor.eps_clip)"})
    eps_clip_high: float = field(
        default=0.0, metadata={"help": "upper ratio clip, DAPO's clip-higher (0: eps_clip; --actor.eps_clip_low_high)"}
    )
    value_clip: float = field(default=0.5, metadata={"help": "value clip (--critic.value_clip)"})
    reward_clip: float = field(
        default=10.0, metadata={"help": "episode rewards clipped to +-this (--reward.clip_range)"}
    )
    critic_warmup: int = field(
        default=0, metadata={"help": "iterations that train the critic only (--critic.freezing_steps)"}
    )
    entropy_coef: float = field(default=0.0, metadata={"help": "entropy bonus (0: logged only; --actor.entropy_coef)"})
    max_norm: float = field(default=1.0, metadata={"help": "gradient clipping norm"})
    temperature: float = field(default=1.0, metadata={"help": "rollout sampling temperature"})
    top_p: float = field(default=1.0, metadata={"help": "rollout nucleus sampling"})
    max_len: int = field(default=4096, metadata={"help": "tokens per episode (--data.max_len)"})
    generate_batch: int = field(default=64, metadata={"help": "requests per HF generate call"})
    vllm_url: str = field(
        default="",
        metadata={
            "help": "rollouts from this vLLM server (http://HOST:PORT, run with VLLM_SERVER_DEV_MODE=1 where it can "
            "read OUT/ppo/rollout_policy: the actor is saved there and reloaded in place before each rollout; "
            "'': HF generate in this process)"
        },
    )
    filter_groups: bool = field(
        default=False,
        metadata={
            "help": "train only on questions whose samples got different rewards (DAPO's dynamic sampling, without "
            "re-sampling; needs estimator group_norm and n_samples_per_prompt >= 2): uniform groups have no "
            "group-baseline advantage"
        },
    )
    prompt_filter: Literal["none", "missing_gold"] = field(
        default="none",
        metadata={
            "help": "none: every question of ppo.prompts; missing_gold: only those whose start documents (the "
            "label's, then the question's top env.question_docs) miss a gold passage, so a search has something to "
            "find (needs the rows' gold ids; r3_env/train/searchable.py)"
        },
    )
    ptx_data: str = field(
        default="",
        metadata={
            "help": "teacher transcripts (r3rag coldstart sft-data, transcript form) whose SFT loss joins every actor "
            "step: PPO-ptx (InstructGPT; OpenRLHF's former --pretrain_data), here with the cold-start data, so RL "
            "keeps the teacher's signal on the questions its samples all fail ('': RL loss only)"
        },
    )
    ptx_coef: float = field(default=0.05, metadata={"help": "weight of that SFT loss (OpenRLHF's former --ptx_coef)"})
    ptx_batch_size: int = field(
        default=2, metadata={"help": "transcripts per actor step, taken in turn over seeded passes of ptx_data"}
    )
    ptx_select: Literal["every_step", "failed"] = field(
        default="every_step",
        metadata={
            "help": "which transcripts: every_step, ptx_batch_size of them with each actor step (PPO-ptx); failed, "
            "those of the questions none of whose samples was right, matched by id and shared in turn among the "
            "iteration's actor steps (teacher guidance on failure, as DGPO; ptx_batch_size unused)"
        },
    )
    eval_prompts: str = field(
        default="",
        metadata={
            "help": "dev .jsonl (FlashRAG): greedy episodes of the actor on it every eval_every iterations pick "
            "ppo/best_policy by mean reward ('': no dev evaluation, no best policy)"
        },
    )
    eval_every: int = field(
        default=5, metadata={"help": "iterations between dev evaluations (also before the first and after the last)"}
    )
    eval_questions: int = field(default=100, metadata={"help": "dev questions evaluated: the file's first N (0: all)"})

    def __post_init__(self) -> None:
        sizes = (self.iterations, self.rollout_batch_size, self.n_samples_per_prompt, self.micro_batch_size)
        if min(*sizes, self.train_batch_size, self.max_epochs, self.max_len, self.generate_batch) < 1:
            raise ValueError("ppo iterations, batch sizes, max_epochs, max_len and generate_batch must be at least 1")
        if self.train_batch_size % self.micro_batch_size:
            raise ValueError(f"ppo.train_batch_size ({self.train_batch_size}) must divide by micro_batch_size")
        if self.actor_lr <= 0 or self.critic_lr <= 0 or self.reward_clip <= 0 or self.temperature <= 0:
            raise ValueError("ppo learning rates, reward_clip and temperature must be positive")
        if not 0 <= self.gamma <= 1 or not 0 <= self.lambd <= 1:
            raise ValueError("ppo gamma and lambd must lie in [0, 1]")
        if self.eps_clip <= 0 or self.eps_clip_high < 0:
            raise ValueError("ppo.eps_clip must be positive and eps_clip_high 0 or more")
        if self.filter_groups and (self.estimator != "group_norm" or self.n_samples_per_prompt < 2):
            raise ValueError(
                "ppo.filter_groups drops questions whose samples share one reward, which carry no advantage only under "
                "a group baseline: set ppo.estimator group_norm and ppo.n_samples_per_prompt >= 2"
            )
        if self.ptx_coef < 0 or self.ptx_batch_size < 1:
            raise ValueError("ppo.ptx_coef must be 0 or more and ppo.ptx_batch_size at least 1")
        if self.ptx_select == "failed" and not self.ptx_data:
            raise ValueError(
                "ppo.ptx_select failed trains on the teacher's transcripts of the failed questions: set ppo.ptx_data "
                "to them (r3rag coldstart sft-data, transcript form)"
            )
        if self.eval_every < 1 or self.eval_questions < 0:
            raise ValueError("ppo.eval_every must be at least 1 and eval_questions 0 or more")
        if self.estimator == "group_norm" and self.n_samples_per_prompt < 2:
            raise ValueError("ppo.estimator group_norm normalises over a question's samples: n_samples_per_prompt >= 2")

    @property
    def episodes(self) -> int:
        return self.rollout_batch_size * self.n_samples_per_prompt


@dataclass(frozen=True)
class HealthConfig:
    """When PPO's health monitor (:mod:`r3_env.train.health`) warns that the policy is going wrong."""

    baseline_iterations: int = field(
        default=3,
        metadata={
            "help": "the first iterations whose mean is each share's and the retrievals' baseline (nothing warns "
            "before)"
        },
    )
    share_margin: float = field(
        default=0.2,
        metadata={
            "help": "a share (unanswered, format errors, blank, repeated or copied queries) warns when it is more "
            "than this above its baseline ..."
        },
    )
    share_floor: float = field(default=0.3, metadata={"help": "... and at least this"})
    drift_factor: float = field(
        default=1.3,
        metadata={
            "help": "retrievals per episode warn when their mean over the drift_window iterations is above this "
            "times their baseline, or below the baseline divided by it"
        },
    )
    drift_window: int = field(
        default=3,
        metadata={"help": "iterations, the current one included, whose mean retrievals per episode are compared"},
    )
    spike_factor: float = field(
        default=3.0,
        metadata={
            "help": "KL or entropy spikes above this times its median over the spike_window iterations before; "
            "entropy collapses below that median divided by it"
        },
    )
    spike_window: int = field(default=10, metadata={"help": "iterations whose median a spike is measured against"})
    kl_floor: float = field(default=0.01, metadata={"help": "a KL below this never counts as a spike"})
    copy_similarity: float = field(
        default=0.8,
        metadata={"help": "a query copies the question when their word sets' Jaccard similarity is at least this"},
    )

    def __post_init__(self) -> None:
        if min(self.baseline_iterations, self.spike_window, self.drift_window) < 1:
            raise ValueError("health.baseline_iterations, spike_window and drift_window must be at least 1")
        if self.share_margin < 0 or not 0 <= self.share_floor <= 1 or self.kl_floor < 0:
            raise ValueError("health.share_margin and kl_floor must be 0 or more, share_floor in [0, 1]")
        if self.spike_factor <= 1 or not 0 < self.copy_similarity <= 1:
            raise ValueError("health.spike_factor must be above 1 and copy_similarity in (0, 1]")
        if self.drift_factor <= 1:
            raise ValueError("health.drift_factor must be above 1 (1.3 warns at 30% more retrievals, or 1/1.3 as many)")


SECTIONS = [
    ("", RunConfig),
    ("model.", ModelConfig),
    ("sft.", SFTConfig),
    ("ppo.", PPOConfig),
    *((f"{name}.", section) for name, section in ROLLOUT_SECTIONS.items()),
    ("health.", HealthConfig),
]


# A recipe's RL algorithm (algo.name) as the local trainer's ppo settings, as launch/ppo_r3.sh maps it onto OpenRLHF.
# The KL coefficient is the launch script's default for the algorithm; here it is always a penalty in the reward
# (OpenRLHF's GRPO and DAPO take it as a loss term). DAPO's dynamic sampling is ppo.filter_groups: the groups whose
# rewards all tie are dropped, not sampled again.
LOCAL_ALGOS: dict[str, dict[str, Any]] = {
    "": {},  # left to the launch script, whose default is ppo
    "ppo": {},  # GAE and a critic, the local trainer's defaults
    "grpo": {"estimator": "group_norm", "init_kl_coef": 1e-3},  # group-normalised advantages, no critic
    # group-normalised advantages, clip-higher, dynamic sampling
    "dapo": {"estimator": "group_norm", "eps_clip_high": 0.28, "init_kl_coef": 1e-4, "filter_groups": True},
}
# A setting whose value is a mapping of another setting's choice: merged over the recipe's while that choice is the
# recipe's (as launch/ppo_r3.sh merges REWARD_OPTIONS), dropped when another is chosen.
CHOICE_OPTIONS = {("reward", "options"): "scheme", ("policy", "format_options"): "step_format"}


def algo_settings(algo: AlgoSection) -> dict[str, Any]:
    """A recipe's algorithm as ``ppo.*`` settings: its estimator, clip, KL coefficient and group filter, and the
    rollout temperature and top-p where it sets them. Its budget (batch sizes, samples per question, learning rate,
    lengths, steps) is a cluster's: the local run keeps its own."""
    if algo.name not in LOCAL_ALGOS:
        known = ", ".join(name for name in LOCAL_ALGOS if name)
        raise ConfigError(
            f"algo.name {algo.name!r} has no local estimator (the local trainer runs {known}): give a copy of the "
            "recipe with one of them"
        )
    settings = dict(LOCAL_ALGOS[algo.name])
    if algo.temperature:
        settings["temperature"] = algo.temperature
    if algo.top_p:
        settings["top_p"] = algo.top_p
    if algo.kl_coef:
        settings["init_kl_coef"] = float(algo.kl_coef)
    return settings


def recipe_settings(name_or_path: str | Path) -> dict[str, dict[str, Any]]:
    """``r3rag train local --recipe``: a recipe's agent sections as written and its algorithm's ppo settings, as
    sections for :func:`layered` and :func:`r3_env.config.configs_from_values`."""
    recipe = load_recipe(name_or_path)
    if recipe.tree is not None:
        raise ConfigError(
            f"recipe {recipe.name!r} trains in progressive rounds of its retrieval tree: run it with "
            f"r3rag r2ag train --config {recipe.path}"
        )
    sections = {section: dict(recipe.agent[section]) for section in AGENT_SECTIONS if section in recipe.agent}
    return {**sections, "ppo": algo_settings(recipe.algo)}


def layered(lower: dict[str, Any], upper: dict[str, Any]) -> dict[str, Any]:
    """``upper``'s sections over ``lower``'s, setting by setting. A scheme's ``options`` (a step format's
    ``format_options``) merge over ``lower``'s while the scheme is ``lower``'s (its default where ``lower`` names
    none), as launch/ppo_r3.sh merges REWARD_OPTIONS over the recipe's; under another scheme ``lower``'s are dropped,
    since they are its scheme's."""
    values = dict(upper)
    for key, section in lower.items():
        mine = upper.get(key)
        if mine is None:
            values[key] = section
        elif isinstance(mine, dict):
            values[key] = merged = {**section, **mine}
            for (owner, options), choice in CHOICE_OPTIONS.items():
                if owner != key or options not in section:
                    continue
                default = _default(owner, choice)
                if merged.get(choice, default) != section.get(choice, default):
                    if options not in mine:
                        del merged[options]
                elif options in mine:
                    where = f"{owner}.{options}"
                    merged[options] = {**_mapping(section[options], where), **_mapping(mine[options], where)}
    return values


def _default(section: str, name: str) -> Any:
    """An agent section's default for one setting (the scheme a recipe that names none runs)."""
    return next(f.default for f in dataclasses.fields(ROLLOUT_SECTIONS[section]) if f.name == name)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    """Options as a mapping: a file's, or JSON text as a flag's value is."""
    return json_object(value, where) if isinstance(value, str) else value
