"""``r3rag train local``: cold-start SFT, then PPO, on one machine, into one run folder.

The run folder holds ``config.json`` (the resolved settings; a rerun with other settings is
refused, so a resumed run is the run it claims to be), ``metrics.jsonl`` and ``tensorboard/``,
``sft/`` and ``ppo/`` with their checkpoints and final policies; ``ppo/health.jsonl`` holds the PPO
health monitor's checks and warnings, and ``ppo/best_policy`` the policy with the best dev reward
(when ``ppo.eval_prompts`` is set). SFT runs when ``sft.data`` is set; PPO runs when ``ppo.prompts``
is set, from the SFT policy when there is one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from r3_env.allocator import release_freed_memory
from r3_env.config import ConfigError, configs_from_values
from r3_env.rollout_config import RolloutConfig
from r3_env.train.config import SECTIONS, HealthConfig, ModelConfig, PPOConfig, RunConfig, SFTConfig
from r3_env.train.metrics import MetricsLog

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class LocalTrainConfig:
    run: RunConfig
    model: ModelConfig
    sft: SFTConfig
    ppo: PPOConfig
    rollout: RolloutConfig
    health: HealthConfig = field(default_factory=HealthConfig)

    @classmethod
    def from_sections(cls, run, model, sft, ppo, env, reward, services, policy, health=None) -> LocalTrainConfig:
        return cls(run, model, sft, ppo, RolloutConfig(env, reward, services, policy), health or HealthConfig())

    def to_json(self) -> dict[str, Any]:
        return {
            "run": dataclasses.asdict(self.run),
            "model": dataclasses.asdict(self.model),
            "sft": dataclasses.asdict(self.sft),
            "ppo": dataclasses.asdict(self.ppo),
            **dataclasses.asdict(self.rollout),
            "health": dataclasses.asdict(self.health),
        }

    def with_settings(self, settings: dict[str, Any], where: str = "--set") -> LocalTrainConfig:
        """A copy with dotted settings changed (``ppo.actor_lr``, ``out``: the keys of ``r3rag train local``),
        typed and checked as its flags are; an unknown key is a ConfigError naming it and the sections."""
        values = self.to_json()
        values = {**values.pop("run"), **values}
        for key, value in settings.items():
            section, _, name = key.rpartition(".")
            target = values.get(section) if section else values
            if not isinstance(target, dict) or name not in target:
                sections = ", ".join(k for k, v in values.items() if isinstance(v, dict))
                raise ConfigError(f"{where} {key}: no such setting; keys are SECTION.NAME, SECTION one of {sections}")
            target[name] = value
        return LocalTrainConfig.from_sections(*configs_from_values(values, SECTIONS, where=where))


def _changed(old: dict, new: dict, defaults: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ; a key the old record lacks (a setting added since) at its default does not."""
    keys = []
    for key in sorted(set(old) | set(new)):
        a, b, name = old.get(key), new.get(key), f"{prefix}{key}"
        if key not in old and isinstance(b, dict):  # a section added since: its settings are checked one by one
            a = {}
        if isinstance(a, dict) and isinstance(b, dict):
            keys += _changed(a, b, defaults, f"{name}.")
        elif key not in old and name in defaults and defaults[name] == b:
            continue
        elif a != b:
            keys.append(name)
    return keys


def _defaults(config: LocalTrainConfig) -> dict[str, Any]:
    """Each setting's default, by its dotted key."""
    sections = {"run": config.run, "model": config.model, "sft": config.sft, "ppo": config.ppo, "health": config.health}
    sections.update((f.name, getattr(config.rollout, f.name)) for f in dataclasses.fields(config.rollout))
    return {
        f"{name}.{f.name}": f.default
        for name, section in sections.items()
        for f in dataclasses.fields(section)
        if f.default is not dataclasses.MISSING
    }


# Settings that may change between a run and its resumption: where the services are, how fast to go, when to warn.
RESUMABLE = (
    "services.",
    "run.threads",
    "run.device",
    "run.save_every",
    "ppo.generate_batch",
    "ppo.vllm_url",
    "health.",
)


def check_config(out: Path, config: LocalTrainConfig) -> None:
    """Record the settings, or refuse a rerun that changes what was trained."""
    path = out / CONFIG_FILE
    current = config.to_json()
    if path.is_file():
        old = json.loads(path.read_text())
        changed = [k for k in _changed(old, current, _defaults(config)) if not k.startswith(RESUMABLE)]
        if changed:
            raise ConfigError(
                f"{out} was trained with other settings ({', '.join(changed)}): give another run folder (--out), "
                "or set them back to resume it"
            )
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(current, indent=2) + "\n")


STAGES = ("sft", "ppo")


def train_local(
    config: LocalTrainConfig, stages: tuple[str, ...] = STAGES, search: Any = None, judge: Any = None
) -> dict[str, Path]:
    """SFT then PPO as configured (``stages`` picks some); returns the final policies' folders by stage.

    PPO starts from the SFT policy whenever ``sft.data`` is set (SFT runs first if it has not).
    """
    from r3_env.train.ppo import PPOTrainer
    from r3_env.train.sft import run_sft

    if not config.sft.data and not config.ppo.prompts:
        raise ConfigError("nothing to train: set sft.data (cold-start SFT) and/or ppo.prompts (PPO)")
    if config.run.threads:
        torch.set_num_threads(config.run.threads)
    out = Path(config.run.out)
    check_config(out, config)
    metrics = MetricsLog(out)
    results: dict[str, Path] = {}
    try:
        policy = config.model.policy
        if config.sft.data and ("sft" in stages or config.ppo.prompts):
            results["sft"] = policy = str(run_sft(config.run, config.model, config.sft, config.rollout, metrics))
            release_freed_memory()
        if config.ppo.prompts and "ppo" in stages:
            trainer = PPOTrainer(
                config.run, config.model, config.ppo, config.rollout, policy, metrics, search, judge, config.health
            )
            try:
                results["ppo"] = trainer.train()
            finally:
                trainer.close()
                del trainer
                release_freed_memory()
    finally:
        metrics.close()
    return {stage: Path(path) for stage, path in results.items()}
