"""PPO's updates on one machine: OpenRLHF's ``PolicyLoss`` (clipped ratio), ``ValueLoss`` (clipped values),
``compute_entropy`` and ``SFTLoss`` over the experiences :class:`r3_env.train.ppo.PPOTrainer` makes.

Accumulation, clipping and AdamW steps are the local trainer's own: OpenRLHF runs them through DeepSpeed,
which needs a GPU. With ``ppo.ptx_data`` each actor step also takes ``ptx_coef`` times the SFT loss of
``ptx_batch_size`` teacher transcripts (PPO-ptx); with ``ptx_select failed`` the trainer hands the iteration's
actor steps the failed questions' transcripts instead (:mod:`r3_env.train.guidance`), each in turn.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import torch

from r3_env.train.config import PPOConfig
from r3_env.train.guidance import Transcripts
from r3_env.train.models import make_optimizer
from r3_env.train.sft import sft_backward

PTX_SEED_OFFSET = 7  # the transcripts' order has a seed of its own: it does not follow the questions'


class PPOUpdates:
    """The actor's and the critic's optimizer steps over one iteration's experiences, and the teacher's
    transcripts that join the actor's (PPO-ptx); its state is part of the trainer's checkpoint."""

    def __init__(
        self,
        ppo: PPOConfig,
        actor: Any,
        critic: Any,
        device: torch.device,
        optimizer_steps: int,
        ptx: Any = None,
        seed: int = 0,
    ) -> None:
        from openrlhf.models import PolicyLoss, SFTLoss, ValueLoss
        from openrlhf.models.utils import compute_entropy

        self.ppo, self.actor, self.critic, self.device = ppo, actor, critic, device
        self.policy_loss = PolicyLoss(clip_eps_low=ppo.eps_clip, clip_eps_high=ppo.eps_clip_high or ppo.eps_clip)
        self.value_loss = ValueLoss(clip_eps=ppo.value_clip)
        self.ptx, self.ptx_loss, self.ptx_position, self.seed = ptx, SFTLoss(), 0, seed
        # torch.compile'd on GPU (OpenRLHF's choice); its eager body on CPU, where compiling costs more than it saves
        self.entropy = compute_entropy
        if device.type != "cuda":
            self.entropy = getattr(compute_entropy, "_torchdynamo_orig_callable", compute_entropy)
        self.actor_optim, self.actor_sched = make_optimizer(actor, ppo.actor_lr, optimizer_steps)
        self.critic_optim = self.critic_sched = None
        if critic is not None:
            self.critic_optim, self.critic_sched = make_optimizer(critic, ppo.critic_lr, optimizer_steps)

    def train_on(
        self, batches: Sequence[Any], train_actor: bool = True, guidance: Transcripts | None = None
    ) -> dict[str, float]:
        """``max_epochs`` passes over the micro-batches; one optimizer step per ``train_batch_size`` episodes. The
        first pass's actor steps share ``guidance``'s transcripts in turn, so each is trained once, beside RL."""
        per_step = self.ppo.train_batch_size // self.ppo.micro_batch_size
        actor_steps = math.ceil(len(batches) / per_step)
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}

        def add(name: str, value: float) -> None:
            sums[name] = sums.get(name, 0.0) + value
            counts[name] = counts.get(name, 0) + 1

        for epoch in range(self.ppo.max_epochs):
            order = torch.randperm(len(batches)).tolist()
            for number, start in enumerate(range(0, len(order), per_step)):
                group = [batches[i] for i in order[start : start + per_step]]
                if train_actor:
                    share = guidance.share(number, actor_steps) if guidance and epoch == 0 else None
                    for name, value in self.actor_step(group, share).items():
                        add(name, value)
                if self.critic is not None:
                    for name, value in self.critic_step(group).items():
                        add(name, value)
        return {name: sums[name] / counts[name] for name in sums}

    def actor_step(self, group: Sequence[Any], guidance: Transcripts | None = None) -> dict[str, float]:
        """One optimizer step of the policy loss on ``group``, plus ``ptx_coef`` times the SFT loss of the teacher's
        transcripts: the next ``ptx_batch_size`` (PPO-ptx), or ``guidance`` (the failed questions' share)."""
        from openrlhf.models.utils import masked_mean

        self.actor.train()
        total_tokens, logs = _tokens(group), {"policy_loss": 0.0, "entropy": 0.0, "clip_ratio": 0.0, "ppo_kl": 0.0}
        for batch in group:
            mask = batch.action_mask.to(self.device)
            share = float(batch.action_mask.sum()) / total_tokens
            log_probs, output = self.actor(
                batch.sequences.to(self.device),
                mask,
                attention_mask=batch.attention_mask.to(self.device),
                return_output=True,
            )
            loss, clip_ratio, ppo_kl, _, _ = self.policy_loss(
                log_probs, batch.action_log_probs.to(self.device), batch.advantages.to(self.device), action_mask=mask
            )
            logits = output["logits"][:, :-1][:, -mask.shape[1] :]  # the positions that predict the actions
            # at entropy_coef 0 it is logged only: no graph through a softmax over the vocabulary at every position
            with torch.set_grad_enabled(bool(self.ppo.entropy_coef)):
                entropy = masked_mean(self.entropy(logits), mask)
            (share * (loss - self.ppo.entropy_coef * entropy)).backward()
            for name, value in (
                ("policy_loss", loss),
                ("entropy", entropy),
                ("clip_ratio", clip_ratio),
                ("ppo_kl", ppo_kl),
            ):
                logs[name] += share * float(value.detach())
        if self.ptx is not None:  # PPO-ptx: the teacher's transcripts pull beside the advantages
            logs["ptx_loss"] = self.ptx_backward(Transcripts(self.ptx, self.next_transcripts()))
        elif guidance:
            logs["ptx_loss"] = self.ptx_backward(guidance)
        logs["actor_grad_norm"] = _optimizer_step(self.actor, self.actor_optim, self.actor_sched, self.ppo.max_norm)
        logs["actor_lr"] = self.actor_sched.get_last_lr()[0]
        return logs

    def guidance_step(self, guidance: Transcripts) -> float:
        """An actor step of the guidance alone, when no RL batch was left to weigh it against; the SFT loss."""
        loss = self.ptx_backward(guidance)
        _optimizer_step(self.actor, self.actor_optim, self.actor_sched, self.ppo.max_norm)
        return loss

    def critic_step(self, group: Sequence[Any]) -> dict[str, float]:
        """One optimizer step of the value loss on ``group``."""
        from openrlhf.models.utils import masked_mean

        self.critic.train()
        total_tokens, logs = _tokens(group), {"value_loss": 0.0, "values": 0.0}
        for batch in group:
            mask = batch.action_mask.to(self.device)
            share = float(batch.action_mask.sum()) / total_tokens
            values = self.critic(
                batch.sequences.to(self.device), mask, attention_mask=batch.attention_mask.to(self.device)
            )
            loss = self.value_loss(
                values, batch.values.to(self.device), batch.returns.to(self.device), action_mask=mask
            )
            (share * loss).backward()
            logs["value_loss"] += share * float(loss.detach())
            logs["values"] += share * float(masked_mean(values.detach(), mask))
        logs["critic_grad_norm"] = _optimizer_step(self.critic, self.critic_optim, self.critic_sched, self.ppo.max_norm)
        return logs

    def ptx_backward(self, transcripts: Transcripts) -> float:
        """Accumulate ``ptx_coef`` times the SFT loss of ``transcripts`` into the actor's gradients; the loss."""
        micro = self.ppo.micro_batch_size
        loss, _ = sft_backward(
            self.actor, transcripts.dataset, transcripts.items, micro, self.ptx_loss, self.device, self.ppo.ptx_coef
        )
        return loss

    def next_transcripts(self) -> list[Any]:
        """The next ``ptx_batch_size`` teacher transcripts: passes over ``ptx_data``, each in a seeded order."""
        batch = []
        for _ in range(self.ppo.ptx_batch_size):
            batch.append(self.ptx[shuffled_index(self.ptx_position, len(self.ptx), self.seed + PTX_SEED_OFFSET)])
            self.ptx_position += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The optimizers', the schedulers' and the transcripts' place, under the checkpoint's keys."""
        state = {
            "ptx_position": self.ptx_position,
            "actor_optim": self.actor_optim.state_dict(),
            "actor_sched": self.actor_sched.state_dict(),
        }
        if self.critic is not None:
            state.update(critic_optim=self.critic_optim.state_dict(), critic_sched=self.critic_sched.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.actor_optim.load_state_dict(state["actor_optim"])
        self.actor_sched.load_state_dict(state["actor_sched"])
        if self.critic is not None:
            self.critic_optim.load_state_dict(state["critic_optim"])
            self.critic_sched.load_state_dict(state["critic_sched"])
        self.ptx_position = state.get("ptx_position", 0)  # a checkpoint from before PPO-ptx has none


def shuffled_index(position: int, size: int, seed: int) -> int:
    """The index at ``position`` of endless passes over ``size`` items, each pass in its own seeded order."""
    epoch, offset = divmod(position, size)
    order = list(range(size))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order[offset]


def _tokens(group: Sequence[Any]) -> float:
    """The action tokens of ``group``: each micro-batch's loss is weighed by its share of them."""
    return max(float(sum(b.action_mask.sum() for b in group)), 1.0)


def _optimizer_step(module: torch.nn.Module, optimizer: Any, scheduler: Any, max_norm: float) -> float:
    """Clip the gradients to ``max_norm``, step, schedule and clear them; returns the norm before clipping."""
    norm = float(torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm))
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm
