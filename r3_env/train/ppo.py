"""PPO on one machine (CPU or one GPU) with the cluster run's code: the same agent, rewards and RL math.

One iteration:

1. **Rollouts.** r3rag's :class:`~r3_env.openrlhf.agent.AgentExecutor` (the file OpenRLHF's vLLM
   actors load) runs every episode against :class:`~r3_env.engines.HFEngine`, which honours
   OpenRLHF's ``llm_engine.generate`` contract and shares the policy's weights, so no weight sync
   is needed. With ``ppo.vllm_url`` a vLLM server generates instead
   (:class:`~r3_env.engines.VLLMServerEngine`, the same contract): the actor is saved to
   ``ppo/rollout_policy`` and reloaded there before the first rollout of a run (or a resumed
   one) and before each that follows an actor update, as OpenRLHF broadcasts its weights to its
   vLLM engines. vLLM samples with its own generator, so unlike HF's (the checkpoint restores
   torch's RNG) a resumed run does not repeat the uninterrupted run's samples. Retrieval and
   judging go to the services over HTTP, as on a cluster.
2. **Experiences.** OpenRLHF's sample generator turns each executor output into an
   ``Experience`` (r3rag's subclass keeps the per-step rewards); OpenRLHF's experience maker
   splits them into micro-batches. Log-probs (``Actor``), reference log-probs, values (its
   critic) and the KL estimate (``compute_approx_kl``) are filled here, as OpenRLHF's
   ``make_experience`` does with its Ray model groups. Then OpenRLHF's
   ``compute_advantages_and_returns`` (through r3rag's subclass: each step's reward at its last
   token, the KL penalty per token) computes GAE or REINFORCE returns and normalises advantages.
3. **Updates** (:mod:`r3_env.train.ppo_updates`). OpenRLHF's ``PolicyLoss`` (clipped ratio) and
   ``ValueLoss`` (clipped values), and its ``compute_entropy`` for the entropy. With ``ppo.ptx_data`` each
   actor step also takes ``ptx_coef`` times OpenRLHF's ``SFTLoss`` on ``ptx_batch_size`` teacher transcripts
   (PPO-ptx); with ``ptx_select failed``, the iteration's actor steps instead share the transcripts of the
   questions none of whose samples was right (teacher guidance on failure, :mod:`r3_env.train.guidance`), each
   in turn. Accumulation, clipping and AdamW steps are the local trainer's own: OpenRLHF runs them through
   DeepSpeed, which needs a GPU.

Each iteration the health monitor (:mod:`r3_env.train.health`) logs the shares of unanswered
episodes, format errors and blank, repeated or copied queries beside the iteration's values, and
warns (the log and ``ppo/health.jsonl``) when a share rises, the retrievals per episode drift, or
the KL or entropy spikes. With ``ppo.eval_prompts`` the actor runs greedy episodes on those dev
questions before the first iteration, every ``eval_every`` iterations and after the last, through
the same agent and engine (``dev_reward`` is logged); whenever its mean reward beats the best so far
the actor is saved to ``ppo/best_policy``, with ``best.json`` naming the iteration and the dev reward.

Checkpoints (``ppo/checkpoint.pt``: both models, optimizers, schedulers, the KL coefficient,
the data position, the RNG, the best dev reward so far and the health monitor's history) are
written every ``save_every`` iterations and after the last; a rerun resumes from the last. The final
policy is ``ppo/policy``; once it is saved the checkpoint is deleted, as SFT's is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import resource
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from r3_env.data import QAItem, read_dataset, read_label
from r3_env.engines import HFEngine, SamplingParams, TokenEngine
from r3_env.episode import ROLLOUT_OUTCOMES, Outcome
from r3_env.protocol import ChatRenderer
from r3_env.rollout_config import RolloutConfig
from r3_env.train import openrlhf_cpu
from r3_env.train.config import HealthConfig, ModelConfig, PPOConfig, RunConfig
from r3_env.train.guidance import Transcripts, TranscriptsByQuestion
from r3_env.train.health import HEALTH_FILE, HealthMonitor
from r3_env.train.metrics import MetricsLog
from r3_env.train.models import (
    CHECKPOINT_FILE,
    DONE_FILE,
    finished,
    load_actor,
    load_critic,
    load_state,
    load_tokenizer,
    pick_device,
    rng_state,
    save_policy,
    save_state,
    set_rng_state,
)
from r3_env.train.ppo_updates import PPOUpdates, shuffled_index
from r3_env.train.sft import sft_dataset

logger = logging.getLogger(__name__)

BEST_FILE = "best.json"  # in ppo/best_policy: the iteration and dev reward of the policy kept there


def openrlhf_args(ppo: PPOConfig, placement: str) -> SimpleNamespace:
    """The fields of OpenRLHF's hierarchical args that its experience code reads, from ``ppo``.

    Everything else keeps OpenRLHF's parser default (no length penalties, no dynamic batching,
    no train/rollout mismatch correction); tests compare this with OpenRLHF's own parser.
    """
    from r3_env.openrlhf.step_rewards import STEP_ESTIMATORS

    if placement == "step" and ppo.estimator not in STEP_ESTIMATORS:
        raise ValueError(f"per-step rewards need estimator {' or '.join(STEP_ESTIMATORS)}, not {ppo.estimator!r}")
    return SimpleNamespace(
        algo=SimpleNamespace(
            advantage=SimpleNamespace(
                estimator=ppo.estimator,
                gamma=ppo.gamma,
                lambd=ppo.lambd,
                no_std_norm=False,
                is_correction_level="off",
            ),
            kl=SimpleNamespace(init_coef=ppo.init_kl_coef, estimator=ppo.kl_estimator, use_loss=False),
            dynamic_filtering_enable=False,
        ),
        rollout=SimpleNamespace(n_samples_per_prompt=ppo.n_samples_per_prompt, micro_batch_size=ppo.micro_batch_size),
        train=SimpleNamespace(dynamic_batch_enable=False),
        reward=SimpleNamespace(
            clip_range=(-ppo.reward_clip, ppo.reward_clip), overlong_buffer_len=None, stop_properly_penalty_coef=None
        ),
        data=SimpleNamespace(max_len=ppo.max_len),
    )


def _label(item: QAItem) -> str:
    """What OpenRLHF's ``--data.label_key`` hands the agent: the row, so gold ids travel too."""
    return json.dumps(item.to_json())


class PPOTrainer:
    """Owns the models, optimizers, the agent and the engine for one PPO run."""

    def __init__(
        self,
        run: RunConfig,
        model: ModelConfig,
        ppo: PPOConfig,
        rollout: RolloutConfig,
        policy: str,
        metrics: MetricsLog | None = None,
        search: Any = None,
        judge: Any = None,
        health: HealthConfig | None = None,
    ) -> None:
        openrlhf_cpu.enable()
        from r3_env.openrlhf import step_rewards

        step_rewards.install()  # before OpenRLHF's experience maker is imported: it patches compute_reward
        from openrlhf.trainer.ppo_utils.kl_controller import AdaptiveKLController, FixedKLController

        from r3_env.openrlhf.agent import AgentExecutor

        self.run, self.ppo, self.rollout_config, self.metrics = run, ppo, rollout, metrics
        self.folder = Path(run.out) / "ppo"
        self.device = pick_device(run.device)
        random.seed(run.seed)
        torch.manual_seed(run.seed)
        self.tokenizer = load_tokenizer(policy)
        self.actor = load_actor(policy, model, self.device)
        self.reference = None
        if ppo.init_kl_coef > 0:
            self.reference = load_actor(policy, model, self.device, trainable=False).eval().requires_grad_(False)
        else:  # one forward pass fewer per episode, and nothing to watch the policy's drift by
            logger.info("ppo.init_kl_coef 0: no reference model, so no KL penalty, and no KL logged or watched")
        self.critic = load_critic(model.critic or policy, model, self.device) if ppo.estimator == "gae" else None
        self.args = openrlhf_args(ppo, rollout.reward.placement)
        strategy = SimpleNamespace(args=self.args)
        generator_cls, maker_cls = step_rewards.experience_classes()
        self.generator = generator_cls(strategy, None, None, self.tokenizer, [])
        if ppo.kl_target > 0:
            self.kl_ctl = AdaptiveKLController(ppo.init_kl_coef, ppo.kl_target, ppo.kl_horizon)
        else:
            self.kl_ctl = FixedKLController(ppo.init_kl_coef)
        self.maker = maker_cls(None, None, None, None, self.kl_ctl, strategy, self.tokenizer)
        ptx = None  # the teacher's transcripts, for PPO-ptx
        self.guide: TranscriptsByQuestion | None = None  # the same, by question, for the failed questions only
        if ppo.ptx_data:
            template = ChatRenderer(self.tokenizer, rollout.policy.step_format, rollout.policy.chat_template).template
            if ppo.ptx_select == "failed":
                self.guide = TranscriptsByQuestion(ppo.ptx_data, self.tokenizer, ppo.max_len, template, "ppo.ptx_data")
            else:
                ptx = sft_dataset(ppo.ptx_data, self.tokenizer, ppo.max_len, template, field="ppo.ptx_data")
            if len(self.guide.rows if self.guide else ptx) == 0:
                raise ValueError(f"ppo.ptx_data {ppo.ptx_data} holds no transcripts")
        optimizer_steps = ppo.iterations * ppo.max_epochs * math.ceil(ppo.episodes / ppo.train_batch_size)
        # guidance with no RL batch to join (no group's rewards differed) takes a step of its own
        optimizer_steps += ppo.iterations if self.guide else 0
        self.updates = PPOUpdates(ppo, self.actor, self.critic, self.device, optimizer_steps, ptx, run.seed)
        # the staged reward schemes read the trainer's step: the iterations done so far (0 during the first)
        self.executor = AgentExecutor(rollout, search=search, judge=judge, clock=lambda: self.iteration)
        self.server_current = False  # the vLLM server holds the actor's weights
        if ppo.vllm_url:
            from r3_env.engines import VLLMServerEngine

            self.engine: TokenEngine = VLLMServerEngine(ppo.vllm_url)
        else:
            self.engine = HFEngine(self.actor.model, self.tokenizer, max_batch=ppo.generate_batch)
        self.loop = asyncio.new_event_loop()
        self.context = self.loop.run_until_complete(self._context())  # its batchers belong to this loop
        self.items: list[QAItem] = []
        self.dev_items: list[QAItem] = []
        self.iteration = 0
        self.position = 0  # questions consumed, over reshuffled passes of the prompt set
        self.health = HealthMonitor(health, self.folder / HEALTH_FILE)
        self.best: dict[str, float] | None = None  # the best dev reward so far and its iteration

    async def _context(self) -> Any:
        return self.executor.context(self.tokenizer)

    # -- data ---------------------------------------------------------------------------------------

    def load_prompts(self) -> None:
        if not self.ppo.prompts:
            raise ValueError("ppo.prompts is required: a FlashRAG dataset .jsonl of training questions")
        self.items = read_dataset(self.ppo.prompts)
        if not self.items:
            raise ValueError(f"ppo.prompts {self.ppo.prompts} holds no questions")
        if self.context.scheme.needs_gold and not any(read_label(_label(item)).gold_ids for item in self.items):
            # every episode would score neutral (RolloutContext.label_problem) and train nothing
            raise ValueError(
                f"reward.scheme {self.rollout_config.reward.scheme} needs gold passage ids, and none of the "
                f"{len(self.items)} questions in ppo.prompts {self.ppo.prompts} has them: add "
                "metadata.supporting_passage_ids (or a top-level gold_ids) to the rows, or choose a scheme that does "
                "not need them"
            )
        if self.ppo.prompt_filter == "missing_gold":
            self.items = self._questions_with_missing_gold(self.items)
        if self.ppo.eval_prompts:
            self.dev_items = read_dataset(self.ppo.eval_prompts)[: self.ppo.eval_questions or None]
            if not self.dev_items:
                raise ValueError(f"ppo.eval_prompts {self.ppo.eval_prompts} holds no questions")

    def _questions_with_missing_gold(self, items: list[QAItem]) -> list[QAItem]:
        from r3_env.train.searchable import missing_gold

        found = self.loop.run_until_complete(missing_gold(items, self.context.search, self.rollout_config.env, _label))
        logger.info("ppo.prompt_filter missing_gold: %s", found.summary(len(items)))
        if not found.items:
            raise ValueError(
                f"ppo.prompt_filter missing_gold: {found.summary(len(items))} in ppo.prompts {self.ppo.prompts}: add "
                "the gold passages (metadata.supporting_passage_ids or gold_ids), lower env.question_docs, or set "
                "ppo.prompt_filter none"
            )
        return found.items

    def next_prompts(self) -> list[QAItem]:
        """The next ``rollout_batch_size`` questions: passes over the set, each in a seeded order."""
        batch = []
        for _ in range(self.ppo.rollout_batch_size):
            batch.append(self.items[shuffled_index(self.position, len(self.items), self.run.seed)])
            self.position += 1
        return batch

    # -- 1. rollouts --------------------------------------------------------------------------------

    def sync_weights(self) -> float:
        """Have the vLLM server generate with the actor's current weights; returns the seconds it took (0: HF)."""
        if not self.ppo.vllm_url or self.server_current:
            return 0.0
        started = time.perf_counter()
        self.loop.run_until_complete(self.engine.check_untied())  # before the served folder may be rewritten
        folder = save_policy(self.actor.model, self.tokenizer, self.folder / "rollout_policy", untied=True)
        self.loop.run_until_complete(self.engine.reload(folder.resolve()))
        self.server_current = True
        return time.perf_counter() - started

    def rollout(self, items: Sequence[QAItem], greedy: bool = False) -> list[dict[str, Any]]:
        """Every question ``n_samples_per_prompt`` times through the agent (question-major, as OpenRLHF orders them);
        ``greedy``: once each, at temperature 0 (the dev evaluation)."""
        self.actor.eval()
        params = SamplingParams(temperature=self.ppo.temperature, top_p=self.ppo.top_p, max_tokens=None)
        samples = self.ppo.n_samples_per_prompt
        if greedy:
            params, samples = SamplingParams(temperature=0.0, max_tokens=None), 1

        async def episodes() -> list[dict[str, Any]]:
            return await asyncio.gather(
                *(
                    self.executor.execute(
                        prompt=item.question,
                        label=_label(item),
                        sampling_params=params,
                        max_length=self.ppo.max_len,
                        hf_tokenizer=self.tokenizer,
                        llm_engine=self.engine,
                    )
                    for item in items
                    for _ in range(samples)
                )
            )

        return self.loop.run_until_complete(episodes())

    # -- 2. experiences -----------------------------------------------------------------------------

    @torch.no_grad()
    def make_experiences(self, responses: Sequence[dict[str, Any]]) -> list[Any]:
        """Micro-batches of experiences with log-probs, values, KL, advantages and returns (on CPU, as OpenRLHF)."""
        from openrlhf.models.utils import compute_approx_kl, masked_mean

        samples = [self.generator._process_response_into_experience(r, max_len=self.ppo.max_len) for r in responses]
        batches = self.maker.split_rollout_samples(samples)
        for batch in batches:
            log_probs, base, values = self.score(batch)
            if base is not None:
                kl = compute_approx_kl(log_probs, base, kl_estimator=self.ppo.kl_estimator)
            else:
                kl = torch.zeros_like(log_probs)
            batch.action_log_probs = log_probs.float().cpu()
            batch.base_action_log_probs = None  # the KL is in the reward (OpenRLHF without --algo.kl.use_loss)
            batch.values = values.float().cpu() if values is not None else None
            batch.kl = kl.float().cpu()
            batch.info["kl"] = masked_mean(batch.kl, batch.action_mask, dim=-1)
        return self.maker.compute_advantages_and_returns(batches)

    @torch.no_grad()
    def score(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """One micro-batch's model work before the update: the actor's log-probs, the reference's and the critic's
        values (None where there is no such model), on the trainer's device. bench/ppo_update.py times it."""
        self.actor.eval()
        sequences, attention = batch.sequences.to(self.device), batch.attention_mask.to(self.device)
        action_mask = batch.action_mask.to(self.device)
        log_probs = self.actor(sequences, action_mask, attention_mask=attention)
        base = self.reference(sequences, action_mask, attention_mask=attention) if self.reference else None
        values = self.critic(sequences, action_mask, attention_mask=attention) if self.critic else None
        return log_probs, base, values

    # -- 3. updates (r3_env.train.ppo_updates) ------------------------------------------------------

    def _failed_transcripts(
        self, items: Sequence[QAItem], responses: Sequence[dict[str, Any]]
    ) -> tuple[Transcripts, dict[str, float]]:
        """The teacher's transcripts of the questions none of whose samples was right (those without one are
        counted, not trained on), and what to log about them."""
        samples = self.ppo.n_samples_per_prompt
        failed = [
            item.id
            for number, item in enumerate(items)
            if not any(_correct(r) for r in responses[number * samples : (number + 1) * samples])
        ]
        logs = {"failed_questions": float(len(failed)), "ptx_questions": float(sum(q in self.guide for q in failed))}
        return self.guide.transcripts(failed), logs

    # -- the loop -----------------------------------------------------------------------------------

    def step(self) -> dict[str, float]:
        """One iteration: rollouts, experiences, updates. Returns what it logs."""
        context_before = self._service_time()
        sync_s = self.sync_weights()
        busy_before = self.engine.busy_s
        started = time.perf_counter()
        items = self.next_prompts()
        responses = self.rollout(items)
        rollout_s = time.perf_counter() - started
        started = time.perf_counter()
        kept = differing_groups(responses, self.ppo.n_samples_per_prompt) if self.ppo.filter_groups else responses
        batches = self.make_experiences(kept) if kept else []
        warm = self.iteration >= self.ppo.critic_warmup
        train_actor = warm and bool(batches)
        guidance, guided = (None, {}) if self.guide is None or not warm else self._failed_transcripts(items, responses)
        losses = self.updates.train_on(batches, train_actor=train_actor, guidance=guidance) if batches else {}
        if not batches:
            logger.info("PPO %d: every question's samples got the same reward; no RL update", self.iteration + 1)
            if guidance:  # no RL loss to weigh the guidance against: a step of its own
                losses["ptx_loss"] = self.updates.guidance_step(guidance)
                train_actor = True
        losses.update(guided)
        if train_actor:
            self.server_current = False  # the next rollout needs the updated weights
        training_s = time.perf_counter() - started
        retrieval_s, judging_s = (
            after - before for after, before in zip(self._service_time(), context_before, strict=True)
        )
        self.iteration += 1
        values = _episode_stats(responses)
        values.update(losses)
        if batches:  # with nothing trained (or no reference) no KL was measured: none is logged, and the KL
            # controller and the health monitor's spike history see no made-up 0
            if self.reference is not None:
                values["kl"] = float(torch.cat([b.info["kl"].flatten() for b in batches]).mean())
                self.kl_ctl.update(values["kl"], len(responses))
            values["returns"] = float(torch.cat([b.returns[b.action_mask.bool()] for b in batches]).mean())
        values.update(
            kl_coef=float(self.kl_ctl.value),
            actor_trained=float(train_actor),
            trained_share=len(kept) / max(len(responses), 1),
            generation_s=self.engine.busy_s - busy_before,
            retrieval_s=retrieval_s,
            judging_s=judging_s,
            rollout_s=rollout_s,
            training_s=training_s,
            # the trainer's peak resident memory so far (KiB on Linux): a run whose memory grows shows it here
            peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        )
        if self.ppo.vllm_url:
            values["sync_s"] = sync_s
        values.update(self.health.check(self.iteration, responses, values).values)
        return values

    # -- the dev evaluation and the best policy -----------------------------------------------------

    def evaluate(self) -> dict[str, float]:
        """Greedy episodes of the actor on the dev questions, scored as in training: ``dev_reward`` and more."""
        self.sync_weights()
        stats = _episode_stats(self.rollout(self.dev_items, greedy=True))
        return {"dev_reward": stats["reward"], "dev_correct": stats["correct"], "dev_no_answer": stats["no_answer"]}

    def keep_best(self, dev_reward: float) -> bool:
        """Save the actor to ``ppo/best_policy`` when ``dev_reward`` beats the best so far (ties keep the earlier)."""
        if self.best is not None and dev_reward <= self.best["dev_reward"]:
            return False
        folder = save_policy(self.actor.model, self.tokenizer, self.folder / "best_policy")
        self.best = {"iteration": self.iteration, "dev_reward": dev_reward}
        (folder / BEST_FILE).write_text(json.dumps(self.best) + "\n")
        logger.info("PPO best policy: iteration %d, dev reward %.4f -> %s", self.iteration, dev_reward, folder)
        return True

    def _evaluation_due(self) -> bool:
        if not self.dev_items:
            return False
        return self.iteration % self.ppo.eval_every == 0 or self.iteration == self.ppo.iterations

    def _service_time(self) -> tuple[float, float]:
        context = self.context
        return context.retrieval_busy_s, context.relevance_batcher.busy_s + context.correctness_batcher.busy_s

    def train(self) -> Path:
        """Run (or resume) all iterations; returns the final policy's folder."""
        final = self.folder / "policy"
        if finished(self.folder):
            logger.info("PPO already finished: %s", final)
            return final
        self.load_prompts()
        self.resume()
        logger.info(
            "PPO: %d iterations of %d questions x %d samples on %s (%s, critic %s)",
            self.ppo.iterations,
            self.ppo.rollout_batch_size,
            self.ppo.n_samples_per_prompt,
            self.device,
            self.ppo.estimator,
            "yes" if self.critic is not None else "no",
        )
        if self.iteration == 0 and self._evaluation_due():  # the starting policy may stay the best
            values = self.evaluate()
            self.keep_best(values["dev_reward"])
            if self.metrics is not None:
                self.metrics.log("ppo", 0, values)
            logger.info("PPO 0/%d: dev reward %.3f", self.ppo.iterations, values["dev_reward"])
        while self.iteration < self.ppo.iterations:
            started = time.perf_counter()
            values = self.step()
            values["iteration_s"] = time.perf_counter() - started
            if self._evaluation_due():
                started = time.perf_counter()
                values.update(self.evaluate())
                values["dev_s"] = time.perf_counter() - started
                self.keep_best(values["dev_reward"])
            if self.metrics is not None:
                self.metrics.log("ppo", self.iteration, values)
            logger.info(
                "PPO %d/%d: reward %.3f, correct %.0f%%, searched %.0f%%, found_gold %.0f%%, KL %s, "
                "entropy %s%s%s (%.1f s: %sgeneration %.1f, retrieval %.2f, judging %.2f, training %.1f)",
                self.iteration,
                self.ppo.iterations,
                values["reward"],
                100 * values["correct"],
                100 * values["searched"],
                100 * values["found_gold"],
                _measured(values, "kl"),  # none without a reference model or an update
                _measured(values, "entropy"),
                f", value loss {values['value_loss']:.4f}" if "value_loss" in values else "",
                f", dev reward {values['dev_reward']:.3f}" if "dev_reward" in values else "",
                values["iteration_s"],
                f"weight sync {values['sync_s']:.1f}, " if "sync_s" in values else "",
                values["generation_s"],
                values["retrieval_s"],
                values["judging_s"],
                values["training_s"],
            )
            if self.iteration % self.run.save_every == 0 or self.iteration == self.ppo.iterations:
                self.save()
        save_policy(self.actor.model, self.tokenizer, final)
        (self.folder / DONE_FILE).write_text(json.dumps({"iterations": self.iteration}) + "\n")
        (self.folder / CHECKPOINT_FILE).unlink(missing_ok=True)  # the final policy supersedes it (1.6 GB at 135M)
        logger.info("PPO done: %d iterations -> %s", self.iteration, final)
        return final

    def save(self) -> None:
        state = {
            "iteration": self.iteration,
            "position": self.position,
            "kl_coef": float(self.kl_ctl.value),
            "questions": [item.id for item in self.items],  # what `position` counts through, in its order
            "actor": self.actor.model.state_dict(),
            "rng": rng_state(),
            "best": self.best,
            "health": self.health.state_dict(),
            **self.updates.state_dict(),  # the optimizers, schedulers and the transcripts' place
        }
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
        save_state(self.folder / CHECKPOINT_FILE, state)

    def resume(self) -> bool:
        state = load_state(self.folder / CHECKPOINT_FILE)
        if state is None:
            return False
        self._check_questions(state.get("questions"))
        self.actor.model.load_state_dict(state["actor"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
        self.updates.load_state_dict(state)
        self.iteration, self.position = state["iteration"], state["position"]
        self.kl_ctl.value = state["kl_coef"]
        self.best = state.get("best")
        saved = self.folder / "best_policy" / BEST_FILE  # written at an evaluation, maybe after this checkpoint
        if saved.exists():
            on_disk = json.loads(saved.read_text())
            if self.best is None or on_disk["dev_reward"] > self.best["dev_reward"]:
                self.best = on_disk
        self.health.load_state_dict(state.get("health") or {})
        set_rng_state(state["rng"])
        logger.info("PPO resumes after iteration %d from %s", self.iteration, self.folder / CHECKPOINT_FILE)
        return True

    def _check_questions(self, trained: list[str] | None) -> None:
        """Refuse to resume over other questions than the checkpoint's: its place in their order would point at
        other ones. A checkpoint from before questions were saved (None), or prompts not loaded, pass."""
        now = [item.id for item in self.items]
        if trained is None or not now or trained == now:
            return
        missing = len(set(trained) - set(now))
        how = f"{missing} of the checkpoint's are not among them" if missing else "in another order, or with more"
        raise ValueError(
            f"ppo.prompts: the checkpoint {self.folder / CHECKPOINT_FILE} trained on {len(trained)} questions and this "
            f"run draws from {len(now)}, {how} (ppo.prompts edited, or ppo.prompt_filter's retrieval index changed). "
            "Restore them to resume, or train afresh in another run.out"
        )

    def close(self) -> None:
        self.health.close()
        self.loop.run_until_complete(self.context.aclose())
        if self.ppo.vllm_url:
            self.loop.run_until_complete(self.engine.aclose())
        self.loop.close()


def differing_groups(responses: Sequence[dict[str, Any]], samples: int) -> list[dict[str, Any]]:
    """The question groups (``samples`` episodes in a row) whose rewards differ: DAPO's dynamic sampling filter.

    A group whose episodes all got the same reward has zero advantage under a group baseline, so it
    costs a forward and backward pass and teaches nothing; dropping it spends CPU on the groups that do.
    """
    kept = []
    for start in range(0, len(responses), samples):
        group = responses[start : start + samples]
        rewards = [float(r["reward"]) for r in group]
        if max(rewards) - min(rewards) > 1e-6:
            kept.extend(group)
    return kept


def _correct(response: dict[str, Any]) -> bool:
    return bool((response.get("extra_logs") or {}).get(Outcome.CORRECT.log_key))


def _measured(values: dict[str, float], key: str) -> str:
    """A logged figure, or "n/a" where this iteration measured none (no reference model, no update)."""
    return f"{values[key]:.4f}" if key in values else "n/a"


def _episode_stats(responses: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Mean reward and score, outcome shares and counts, steps, retrievals and documents read per episode; and
    what searching paid: the shares of episodes that searched and that found a gold passage their start lacked
    (``found_gold``), and the mean reward with and without a search (each left out when no episode had it)."""
    count_all = max(len(responses), 1)

    def mean(values: Sequence[float]) -> float:
        return float(sum(values)) / count_all

    logs = [r.get("extra_logs") or {} for r in responses]
    stats = {
        "reward": mean([r["reward"] for r in responses]),
        "score": mean([r["scores"] for r in responses]),
        "episodes": float(len(responses)),
        "steps": mean([log.get("num_steps", 0.0) for log in logs]),
        "retrievals": mean([log.get("retrievals", 0.0) for log in logs]),
        "docs_read": mean([log.get("num_docs", 0.0) for log in logs]),
        "relevance": mean([log.get("relevance_mean", 0.0) for log in logs]),
        "response_tokens": mean([sum(end - start for start, end in r["action_ranges"]) for r in responses]),
    }
    searched = [log.get("retrievals", 0.0) > 0 for log in logs]
    stats["searched"] = mean([float(s) for s in searched])
    stats["found_gold"] = mean([float(log.get("new_gold", 0.0) > 0) for log in logs])
    for key, wanted in (("reward_searched", True), ("reward_not_searched", False)):
        rewards = [r["reward"] for r, s in zip(responses, searched, strict=True) if s == wanted]
        if rewards:
            stats[key] = float(sum(rewards)) / len(rewards)
    steps = [log["reward_step"] for log in logs if "reward_step" in log]
    if steps:  # the training step a staged reward scheme saw
        stats["reward_step"] = float(sum(steps)) / len(steps)
    for outcome in ROLLOUT_OUTCOMES:
        count = sum(log.get(outcome.log_key, 0.0) for log in logs)
        stats[outcome.value], stats[f"n_{outcome.value}"] = count / count_all, count
    return stats


def evaluate_rewards(
    policy: str,
    items: Sequence[QAItem],
    rollout: RolloutConfig,
    device: str = "auto",
    max_len: int = 4096,
    generate_batch: int = 64,
) -> dict[str, float]:
    """Greedy episodes of ``policy`` through the agent, scored as in training: mean reward and outcome shares."""
    import dataclasses

    from transformers import AutoModelForCausalLM

    from r3_env.openrlhf.agent import AgentExecutor

    # one reward per episode is all this needs: no per-step extension in this process
    config = dataclasses.replace(rollout, reward=dataclasses.replace(rollout.reward, placement="scalar"))
    tokenizer = load_tokenizer(policy)
    model = AutoModelForCausalLM.from_pretrained(policy).to(pick_device(device))
    engine = HFEngine(model, tokenizer, max_batch=generate_batch)
    executor = AgentExecutor(config)
    params = SamplingParams(temperature=0.0, max_tokens=None)

    async def episodes() -> list[dict[str, Any]]:
        try:
            return await asyncio.gather(
                *(executor.execute(item.question, _label(item), params, max_len, tokenizer, engine) for item in items)
            )
        finally:
            await executor.context(tokenizer).aclose()

    return _episode_stats(asyncio.run(episodes()))
