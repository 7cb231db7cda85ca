"""What the demo trains, each setting beside the measurement that chose it: the model recipes (budgets, costs, SFT
and RL settings for the tiny policy, a pre-trained model on the world, and one on real questions), the methods
(recipes/<name>.yaml and the demo's trainer settings over them) and the episode rules. :mod:`demo.run` runs them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from r3_env.recipes import load_recipe
from r3_env.train.config import algo_settings


@dataclass(frozen=True)
class Budget:
    """How much of everything one demo run does."""

    entities: int
    coldstart_questions: int  # train questions the scripted teacher answers (0: all); about 60% are kept
    sft_epochs: int
    ppo_iterations: int
    rollout_batch_size: int
    n_samples_per_prompt: int
    eval_questions: int  # dev questions per evaluation (per dataset on real questions; 0: all)


@dataclass(frozen=True)
class Costs:
    """What one unit of each stage takes on 2 CPU cores (measured; docs/results.md): the demo's plan."""

    prepare_s: float  # world, index, services, cold start, the model, SFT data
    sft_example_s: float  # one SFT example, one epoch
    eval_start_s: float  # an evaluation's fixed cost (its engine starting)
    eval_question_s: float  # one question of a trained policy (the untrained one fails at its first step)
    untrained_question_s: float
    rl_start_s: float  # the RL stage's fixed cost (models, a vLLM server)
    rl_episode_s: float  # one sampled episode, trained on
    sft_keep: float  # the share of cold-start questions the teacher keeps (the SFT examples before they exist)


def recipe_design(name: str) -> dict[str, Any]:
    """A recipe's RL design as the local trainer's dotted settings: its step rules (the question's documents are
    the cold start's too: ``ModelRecipe.question_docs``), its reward, and its algorithm's estimator, rollout
    temperature and KL where it sets them (not its cluster budget). The cluster path runs the same file
    (``RECIPE=NAME launch/ppo_r3.sh``); ``r3rag train local --recipe NAME`` takes all of its agent sections."""
    recipe = load_recipe(name)
    agent = recipe.rollout_config()  # the agent's sections, built once
    design = {
        "env.stop_after_action": agent.env.stop_after_action,
        "env.query_with_question": agent.env.query_with_question,
        "reward.scheme": agent.reward.scheme,
        "reward.placement": agent.reward.placement,
        "reward.options": dict(agent.reward.options),
    }
    return design | {f"ppo.{key}": value for key, value in algo_settings(recipe.algo).items()}


@dataclass(frozen=True)
class ModelRecipe:
    """How the demo trains one kind of policy: its budgets (full and ``--quick``), model and optimiser settings,
    and what each stage costs.

    A random tiny model needs a large learning rate and many epochs to learn the protocol at all; a
    pre-trained instruct model needs small steps, and each of its steps costs a hundred times more.
    """

    full: Budget
    quick: Budget
    sft: dict[str, Any]
    ppo: dict[str, Any]
    costs: Costs
    model: dict[str, Any] = field(default_factory=dict)  # r3rag train local's model settings
    lora_rank: int = 0  # SFT through LoRA adapters of this rank (0: full fine-tuning); --lora_rank -1 takes it
    question_docs: int = 0  # env.question_docs, in cold start, RL and evaluation; --question_docs -1 takes it
    # RL's own settings, dotted r3rag train local keys over the SFT run's (env.* ones in evaluation too): a recipe's
    # design (recipes/<rl_design>.yaml, read when asked for, so a broken file breaks only this demo) and the local
    # trainer's own levers over it. Neither: RL continues the SFT run's settings; else RL is a run of its own.
    rl_design: str = ""
    rl_levers: dict[str, Any] = field(default_factory=dict)
    # SFT and actor learning rates are multiplied by this when the policy trains through LoRA adapters
    # (--lora_rank): adapters start at zero and need about ten times full fine-tuning's rate
    # (Schulman et al., "LoRA Without Regret", 2025); a tiny random model is never trained that way.
    lora_lr_scale: float = 1.0

    @property
    def rl(self) -> dict[str, Any]:
        """The RL stage's settings: the design's, then the levers."""
        return {**(recipe_design(self.rl_design) if self.rl_design else {}), **self.rl_levers}


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
    costs=Costs(
        prepare_s=15,
        sft_example_s=0.12,
        eval_start_s=2,
        eval_question_s=0.2,
        untrained_question_s=0.05,
        rl_start_s=5,
        rl_episode_s=0.45,
        sft_keep=0.8,
    ),
)
PRETRAINED = ModelRecipe(
    full=Budget(
        entities=2000,
        coldstart_questions=320,  # about 255 examples: twice the questions at half the epochs of 160 x 2
        sft_epochs=1,
        ppo_iterations=3,
        rollout_batch_size=4,
        n_samples_per_prompt=4,
        eval_questions=100,
    ),
    # --quick checks the default's path with its settings unchanged, within 3 minutes on 2 cores: about 6 SFT
    # examples, two RL updates of 2 episodes each
    quick=Budget(
        entities=200,
        coldstart_questions=8,
        sft_epochs=1,
        ppo_iterations=2,
        rollout_batch_size=1,
        n_samples_per_prompt=2,
        eval_questions=4,
    ),
    # SFT and RL train all of SmolLM2 under bf16 autocast where the CPU computes bf16 natively: 2.08x faster
    # steps than fp32 there (bench/sft_speed.py); a CPU that only emulates bf16 trains in fp32 (auto).
    # Training only the last 10 layers is 3.15x faster and fits the whole demo in 30 minutes, but its SFT
    # reached EM 12 where all layers reach 40 on seed 0's world (docs/results.md): the demo takes the time.
    model={"mixed_precision": "auto"},
    sft={"lr": 1e-4, "batch_size": 8, "micro_batch_size": 2},
    # critic-free (REINFORCE++: per-step returns normalised over the batch): a critic would double the training
    # compute; sampled at 0.7, where SmolLM2's sampled episodes are right often enough to reinforce
    ppo={
        "micro_batch_size": 2,
        "train_batch_size": 16,
        "actor_lr": 1e-6,
        "critic_lr": 9e-6,
        "critic_warmup": 0,
        "estimator": "reinforce",
        "temperature": 0.7,
    },
    costs=Costs(
        prepare_s=45,
        sft_example_s=4.3,
        eval_start_s=60,
        eval_question_s=1.6,
        untrained_question_s=0.3,
        rl_start_s=60,
        rl_episode_s=9.4,
        sft_keep=0.8,
    ),
    lora_lr_scale=10.0,
)
# A pre-trained model on real questions (--data): every train question the evidence teacher keeps, and every
# question of the eval part (eval_questions 0; --eval_questions N: the first N per dataset).
REAL = ModelRecipe(
    full=Budget(
        entities=0,
        coldstart_questions=0,
        sft_epochs=1,
        ppo_iterations=8,
        rollout_batch_size=4,
        n_samples_per_prompt=4,
        eval_questions=0,
    ),
    quick=Budget(
        entities=0,
        coldstart_questions=6,
        sft_epochs=1,
        ppo_iterations=2,
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        eval_questions=3,
    ),
    sft={"lr": 5e-5, "batch_size": 8, "micro_batch_size": 2},
    # recorded in the SFT run's settings (so its folders resume); RL runs under ``rl`` below, which sets all of them
    # again but micro_batch_size (critic_lr goes unused: RL there has no critic)
    ppo={"micro_batch_size": 2, "train_batch_size": 16, "actor_lr": 1e-6, "critic_lr": 9e-6, "critic_warmup": 1},
    # measured with the recipe's defaults (docs/results.md, "The real-question demo"): the untrained policy writes
    # its 128 tokens a step after the question's four documents, so it costs what a trained one does
    costs=Costs(
        prepare_s=60,
        sft_example_s=6.5,
        eval_start_s=40,
        eval_question_s=1.3,
        untrained_question_s=1.2,
        rl_start_s=60,
        rl_episode_s=6.6,
        sft_keep=0.76,
    ),
    lora_lr_scale=10.0,
    # The start every real-question RL design was measured from (docs/results.md#real-questions): one epoch of
    # SFT through rank-16 adapters, with the question's own four documents shown before the first step.
    lora_rank=16,
    question_docs=4,  # recipes/r3_recall.yaml's env.question_docs (tests/test_recipes.py checks they agree)
    # The design that raised Full-Recall over SFT with a CI above 0 over three seeds, and was not below single-shot
    # BM25 at the same documents on any dataset (HotpotQA a tie) (docs/results.md, "Each search with the question's
    # words"). Its step rules, reward and algorithm are recipes/r3_recall.yaml's, each with its reason there.
    rl_design="r3_recall",
    # The local trainer's own levers over it, each with the results section that gave its reason:
    rl_levers={
        # the last 8 layers, no reference model: more episodes per second ("More episodes per second")
        "model.lora_rank": 0,
        "model.trainable_layers": 8,
        "ppo.actor_lr": 2e-5,
        # groups whose rewards all tie dropped (they carry no advantage), 4 actor steps per batch of 4 questions
        # x 4 samples, no critic to warm up ("From a start with more SFT, with group baselines"; "Four actor steps
        # per batch")
        "ppo.filter_groups": True,
        "ppo.train_batch_size": 4,
        "ppo.critic_warmup": 0,
        # the cold start's transcripts of the questions whose samples all failed, in the RL step ("Guidance
        # inside the RL step"); ppo.ptx_data is the demo's own SFT data
        "ppo.ptx_select": "failed",
        "ppo.ptx_coef": 1.0,
        # not RL's: the rate of bench/rl_gain.py's SFT arms (the compute control, rft), which train what RL trains
        "sft.lr": 5e-5,
        # train only on questions whose shown documents lack a gold passage: elsewhere a search cannot pay,
        # and RL learns to stop searching ("Training only where a search can pay")
        "ppo.prompt_filter": "missing_gold",
    },
)


@dataclass(frozen=True)
class Method:
    """Which method the demo trains: its recipe (recipes/<recipe>.yaml: step format, reward, RL algorithm) and the
    demo's own trainer settings on top of it."""

    recipe: str
    ppo: dict[str, Any]  # the local trainer's settings over the recipe algorithm's (algo_settings)
    title: str  # the RL stage, as the demo logs it
    stage_switch: float | None = None  # share of the PPO iterations after which a staged reward's stage 2 starts
    # also evaluate the RL policy answering without retrieval, for the report's answer categories
    no_retrieval_eval: bool = False

    def switch_at(self, iterations: int) -> int | None:
        """The RL iteration (0-based, the trainer's step) at which stage 2 starts, for a staged reward."""
        return None if self.stage_switch is None else round(self.stage_switch * iterations)

    @property
    def step_format(self) -> str:
        return load_recipe(self.recipe).rollout_config().policy.step_format

    @property
    def reward(self) -> dict[str, Any]:
        """The recipe's reward scheme, placement and options."""
        reward = load_recipe(self.recipe).rollout_config().reward
        return {"scheme": reward.scheme, "placement": reward.placement, "options": dict(reward.options)}

    @property
    def trainer_ppo(self) -> dict[str, Any]:
        """The local trainer's ppo settings: the recipe's algorithm, then the demo's own."""
        return {**algo_settings(load_recipe(self.recipe).algo), **self.ppo}


METHODS = {
    # R3-RAG (recipes/r3.yaml): labelled sections, relevance x outcome process rewards, PPO with a critic and GAE
    "r3": Method(recipe="r3", ppo={}, title="PPO (critic, GAE, per-step rewards)"),
    # Learning when to search (recipes/lws.yaml): tags, the staged retrieval-cost reward (the demo starts stage 2
    # half-way), DAPO's group-normalised advantages with clip-higher; the demo runs it without KL and without
    # dynamic sampling (every group trains), as its figures were measured
    "lws": Method(
        recipe="lws",
        ppo={"init_kl_coef": 0.0, "critic_warmup": 0, "filter_groups": False},
        title="RL (group-normalised advantages, clip-higher, staged retrieval-cost reward)",
        stage_switch=0.5,
        no_retrieval_eval=True,
    ),
}


# The demo's RL environment: the paper's (docs/recipes/r3-rag.md#stage-2-rl: top-5, unseen documents only, at most 10,
# 512 characters each) with one new document per step instead of two and shorter steps, which halves
# a transcript's tokens (about 720 instead of 1,360 with the demo's tokenizer) and so CPU time. A step may
# still take 128 tokens: the scripted teacher's longest step is 118 with SmolLM2's tokenizer, and at 96 its
# final steps after three searches were cut off: 19 of the SmolLM2 start's 200 dev episodes (docs/results.md).
ENV = {
    "max_steps": 5,
    "topk": 5,
    "dedup_docs": True,
    "docs_per_step": 1,
    "max_total_docs": 10,
    "doc_chars": 512,
    "format_retries": 0,
    "max_step_tokens": 128,
}
# Real questions (--data): the same rules with two new documents per step, cut to 300 characters
# (the evidence teacher keeps 89% of 2Wiki's chains at two and the steps' prompts stay short on
# CPU), and 128 tokens per step (the teacher's longest step is 120 with SmolLM2's tokenizer).
REAL_ENV = {**ENV, "docs_per_step": 2, "doc_chars": 300}
# Context tokens of an evaluation's engine, HF or vLLM alike (a transcript stays under 3,072, PPO's max_len).
MAX_MODEL_LEN = 4096
# The tiny policy: 4 layers learn the step format within the budget where 2 do not (measured).
MODEL = {"vocab_size": 2048, "hidden_size": 128, "layers": 4, "heads": 4, "kv_heads": 2, "intermediate_size": 512}
