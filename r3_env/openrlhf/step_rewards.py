"""Per-step rewards at each step's last token: the smallest extension of OpenRLHF 0.11's PPO trainer.

OpenRLHF's multi-turn executor sums the step rewards and its experience maker puts that scalar
at the last action token. r3rag's executor also returns ``step_rewards``, one per entry of
``action_ranges``. Two subclasses and one function carry them through:

- :class:`StepRewardSamplesGenerator` turns them into a token-level tensor aligned with the
  action mask (each reward at its step's last token) and keeps it in the experience's ``info``;
- :class:`StepRewardExperienceMaker` hands that tensor to :func:`compute_reward_with_steps`;
- :func:`compute_reward_with_steps` replaces OpenRLHF's ``compute_reward`` in the experience
  maker's module: with step rewards it returns them plus the KL term, and puts at the last
  token only what OpenRLHF's shaping (group baselines, length penalties, clipping) changed in
  the episode's total. Without step rewards it is OpenRLHF's function unchanged.

:func:`install` registers all three (idempotent). ``r3_env.openrlhf.train`` runs it in every Ray
worker through Ray's ``worker_process_setup_hook`` (:data:`SETUP_HOOK`). It imports nothing: the
trainer modules are patched when a process imports them (a rollout-only process never does).

Per-step placement needs an advantage estimator that leaves rewards as they are (``gae``, the
paper's PPO, or ``reinforce``): group baselines (GRPO's ``group_norm``, ``reinforce_baseline``,
``rloo``, ``dr_grpo``) normalise the episode's total, and raw step rewards added to a normalised
total would give later steps advantages of mixed scales. The experience maker refuses that mix;
use ``reward.placement: scalar`` with them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import types
from collections.abc import Sequence

import torch

from r3_env.openrlhf import OPENRLHF_VERSION

logger = logging.getLogger(__name__)

STEP_ESTIMATORS = ("gae", "reinforce")  # estimators that keep rewards as they are
STEP_REWARDS_KEY = "step_rewards"  # the executor's output: one reward per action range
DENSE_KEY = "r3rag_step_reward_tokens"  # the token-level tensor in Experience.info, until advantages
_DENSE_ATTR = "r3rag_step_rewards"  # the tensor attached to experience.kl for compute_reward
SETUP_HOOK = "r3_env.openrlhf.step_rewards.install"
_installed = False
StepRewardSamplesGenerator = None  # the subclasses, made when OpenRLHF's trainer is first imported
StepRewardExperienceMaker = None


def dense_step_rewards(
    step_rewards: Sequence[float], action_ranges: Sequence[tuple[int, int]], action_mask: torch.Tensor
) -> torch.Tensor:
    """A float tensor shaped like ``action_mask`` (OpenRLHF's: sequence positions 1..n-1) with each
    step's reward at the position of its last token.

    A step whose last token was cut off by ``max_len`` gives its reward to the last action token
    that survived, so the total is never lost.
    """
    if len(step_rewards) != len(action_ranges):
        raise ValueError(f"{len(step_rewards)} step rewards for {len(action_ranges)} action ranges")
    dense = torch.zeros(action_mask.shape[-1], dtype=torch.float32)
    kept = torch.nonzero(action_mask.reshape(-1)).flatten()
    if len(kept) == 0:
        return dense
    last_kept = int(kept[-1])
    for reward, (start, end) in zip(step_rewards, action_ranges, strict=True):
        position = end - 2  # last token end-1 of the sequence is position end-2 of the action mask
        if position > last_kept or end <= start:
            position = last_kept
        dense[position] += float(reward)
    return dense


def compute_reward_with_steps(r, kl_coef, kl, action_mask=None, reward_clip_range=None):
    """OpenRLHF's ``compute_reward``, placing per-step rewards when the experience carries them."""
    from openrlhf.models.utils import compute_reward

    dense = getattr(kl, _DENSE_ATTR, None)
    if dense is None:
        return compute_reward(r, kl_coef, kl, action_mask=action_mask, reward_clip_range=reward_clip_range)
    if reward_clip_range:
        r = r.clamp(min=reward_clip_range[0], max=reward_clip_range[1])
    dense = dense.to(device=kl.device, dtype=kl.dtype) * action_mask
    residual = r.to(kl.dtype) - dense.sum(dim=-1)  # what OpenRLHF's shaping changed in the total
    return compute_reward(residual, kl_coef, kl, action_mask=action_mask) + dense


def _classes():
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    class StepRewardSamplesGenerator(SamplesGenerator):
        """Keeps the executor's per-step rewards as a token-level tensor in ``experience.info``."""

        def _process_response_into_experience(self, response, **generate_kwargs):
            experience = super()._process_response_into_experience(response, **generate_kwargs)
            rewards = response.get(STEP_REWARDS_KEY)
            if rewards is not None:
                dense = dense_step_rewards(rewards, response["action_ranges"], experience.action_mask[0])
                experience.info[DENSE_KEY] = dense.unsqueeze(0)
            return experience

    class StepRewardExperienceMaker(RemoteExperienceMaker):
        """Hands each experience's per-step rewards to :func:`compute_reward_with_steps`."""

        def compute_advantages_and_returns(self, experiences):
            for experience in experiences:
                dense = experience.info.pop(DENSE_KEY, None)
                if dense is None:
                    continue
                estimator = self.args.algo.advantage.estimator  # what picks OpenRLHF's reward baseline
                if estimator not in STEP_ESTIMATORS:
                    raise ValueError(
                        f"per-step rewards need --algo.advantage.estimator {' or '.join(STEP_ESTIMATORS)}, not "
                        f"{estimator!r} (its baseline normalises episode totals): set "
                        "reward.placement to scalar (PLACEMENT=scalar in launch/ppo_r3.sh)"
                    )
                if dense.shape != experience.kl.shape:
                    raise ValueError(
                        f"step rewards {tuple(dense.shape)} do not match the action mask {tuple(experience.kl.shape)}"
                    )
                setattr(experience.kl, _DENSE_ATTR, dense)
            return super().compute_advantages_and_returns(experiences)

    return StepRewardSamplesGenerator, StepRewardExperienceMaker


_TRAINER_MODULES = (
    "openrlhf.trainer.ppo_utils.experience_maker",
    "openrlhf.trainer.ppo_trainer",
    "openrlhf.trainer.ppo_trainer_async",
)


def experience_classes() -> tuple[type, type]:
    """The sample generator and experience maker subclasses (made on first use; imports OpenRLHF's trainer)."""
    global StepRewardSamplesGenerator, StepRewardExperienceMaker
    if StepRewardSamplesGenerator is None:
        StepRewardSamplesGenerator, StepRewardExperienceMaker = _classes()
    return StepRewardSamplesGenerator, StepRewardExperienceMaker


def _patch(module: types.ModuleType) -> None:
    """Register the extension in one of OpenRLHF's trainer modules (just imported, or already there)."""
    name = module.__name__
    if name == "openrlhf.trainer.ppo_utils.experience_maker":
        module.compute_reward = compute_reward_with_steps
        return
    generator, maker = experience_classes()
    module.SamplesGenerator = generator
    if name == "openrlhf.trainer.ppo_trainer":
        module.RemoteExperienceMaker = maker
    logger.info("r3rag: per-step rewards registered in %s (OpenRLHF %s)", name, OPENRLHF_VERSION)


class _PatchAfterExec(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        _patch(module)

    def __getattr__(self, name: str):  # get_source, get_filename, ...: the wrapped loader's
        return getattr(self.loader, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches OpenRLHF's trainer modules when, and only if, a process imports them."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _TRAINER_MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchAfterExec(spec.loader)
        return spec


def install() -> None:
    """Register the extension in this process (Ray's ``worker_process_setup_hook`` calls it in every worker).

    Modules already imported are patched now; the others when they are imported. Nothing is
    imported here: importing OpenRLHF's trainer initialises DeepSpeed's accelerator, which must
    not happen before Ray has given the worker its GPU.
    """
    global _installed
    if _installed:
        return
    sys.meta_path.insert(0, _PatchOnImport())
    for name in _TRAINER_MODULES:
        if name in sys.modules:
            _patch(sys.modules[name])
    _installed = True


def installed() -> bool:
    """Whether this process has the extension registered."""
    return _installed


def active() -> bool:
    """Whether the trainer will have the extension: registered here, or this Ray job's workers run the hook."""
    if _installed:
        return True
    try:
        import ray

        if not ray.is_initialized():
            return False
        runtime_env = ray.get_runtime_context().runtime_env or {}
    except Exception:  # no Ray context: only this process counts
        return False
    return runtime_env.get("worker_process_setup_hook") == SETUP_HOOK
