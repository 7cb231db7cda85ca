"""The rollout's settings: the episode's rules, the reward scheme, the services and the policy's format.

One YAML file holds them as four mappings (``env:``, ``reward:``, ``services:``, ``policy:``); the
local trainer reads the same file, and OpenRLHF's rollout actors read a recipe's through
``$R3RAG_AGENT_CONFIG`` and ``$R3RAG_AGENT_OVERRIDES``
(:func:`r3_env.recipes.agent_config_from_environment`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from r3_env.config import configs_from_values
from r3_env.env import EnvConfig


@dataclass(frozen=True)
class PolicyConfig:
    """How the policy sees the episode."""

    step_format: str = "r3"
    format_options: dict[str, Any] = field(default_factory=dict)  # the format's settings (multi_query: max_base, ...)
    chat_template: str = "auto"  # "auto" (the tokenizer's), "plain", or a Jinja template
    trajectory_log: str = ""  # append one JSON line per episode here ("{pid}" is replaced by the process id)


@dataclass(frozen=True)
class EpisodeRewardConfig:
    """Which reward scheme scores an episode, and where its rewards land in the token sequence.

    (The reward server's transcript scoring has its own settings: :class:`reward_server.config.RewardConfig`.)
    """

    scheme: str = "r3"
    options: dict[str, Any] = field(default_factory=dict)  # the scheme's constants
    placement: Literal["step", "scalar"] = "step"  # each step's reward at its last token, or the sum at the end
    query_encoder: str = ""  # encoder folder for schemes that compare query embeddings (lws)
    # The staged schemes' clock: training step = start_step + episodes this engine ran // episodes_per_step.
    # It counts every episode (evaluation and dynamic-filtering replacements too) and restarts with the
    # process: a resumed run sets start_step to the step it resumes from.
    episodes_per_step: int = 0
    start_step: int = 0

    def __post_init__(self) -> None:
        if self.episodes_per_step < 0 or self.start_step < 0:
            raise ValueError("episodes_per_step and start_step must be 0 or more")


@dataclass(frozen=True)
class ServicesConfig:
    """Where the retrieval service and the reward server are, and how hard to try them."""

    retriever_url: str = "http://127.0.0.1:8000"
    reward_url: str = "http://127.0.0.1:8002"
    timeout_s: float = 60.0  # per retrieval request
    judge_timeout_s: float = 300.0  # per judge request (a big judge under load is slow)
    retries: int = 3  # per request, with exponential backoff
    backoff_s: float = 0.5
    episode_retries: int = 1  # run an episode again after a service failure, then flag it
    batch_wait_ms: float = 5.0  # how long a request waits for others to share its batch
    max_batch: int = 256

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.judge_timeout_s <= 0 or self.batch_wait_ms < 0:
            raise ValueError("timeouts must be positive and batch_wait_ms 0 or more")
        if self.retries < 0 or self.episode_retries < 0 or self.max_batch < 1:
            raise ValueError("retries and episode_retries must be 0 or more, max_batch at least 1")


SECTIONS: dict[str, type] = {
    "env": EnvConfig,
    "reward": EpisodeRewardConfig,
    "services": ServicesConfig,
    "policy": PolicyConfig,
}


@dataclass(frozen=True)
class RolloutConfig:
    env: EnvConfig = field(default_factory=EnvConfig)
    reward: EpisodeRewardConfig = field(default_factory=EpisodeRewardConfig)
    services: ServicesConfig = field(default_factory=ServicesConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str = "rollout config") -> RolloutConfig:
        return cls(
            *configs_from_values(values, [(f"{name}.", section) for name, section in SECTIONS.items()], where=where)
        )
