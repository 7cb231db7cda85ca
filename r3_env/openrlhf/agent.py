"""r3rag's multi-turn agent for OpenRLHF: pass this file to ``--train.agent_func_path``.

OpenRLHF builds ``AgentExecutor()`` with no arguments in each vLLM rollout actor and awaits
``execute(...)`` once per sample, many at a time in one event loop. The executor runs one
:func:`r3_env.rollout.run_episode` per call: a step is generated, the environment retrieves or
ends the episode, and the rewards of the configured scheme come back, one per action range.

Configuration comes from ``$R3RAG_AGENT_CONFIG`` (a recipe, recipes/<method>.yaml: its ``env:``, ``reward:``,
``services:`` and ``policy:``) and ``$R3RAG_AGENT_OVERRIDES`` (JSON of dotted keys); ``launch/ppo_r3.sh`` sets both.
With ``reward.placement: step`` (the default) each step's reward reaches the trainer at that
step's last token, which needs ``r3_env.openrlhf.step_rewards`` installed in the trainer
(``python -m r3_env.openrlhf.train`` does it); ``scalar`` gives OpenRLHF the episode's sum only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from openrlhf.utils.agent import AgentExecutorBase

from r3_env.data import Passage
from r3_env.openrlhf import step_rewards
from r3_env.protocol import Step, Turn
from r3_env.recipes import agent_config_from_environment
from r3_env.rollout import RolloutResult, run_episode
from r3_env.rollout_config import RolloutConfig
from r3_env.rollout_context import RolloutContext

# Beside OpenRLHF's keys: the episode's question and queries as text, which ``extra_logs`` (scalars only, made
# tensors by OpenRLHF) cannot carry. OpenRLHF ignores the key; r3rag's local trainer's health monitor reads it.
QUERIES_KEY = "r3rag_queries"


def episode_queries(record: dict[str, Any]) -> dict[str, Any]:
    """The question, every query the episode searched (each of a multi-query step's), and its blank queries: the
    format errors for an empty query (a format regeneration's dropped attempts are not seen)."""
    steps = record.get("steps") or []
    queries = []
    for step in steps:
        if step.get("kind") == "query":
            queries += [step["query"]] if step.get("query") is not None else list(step.get("queries") or [])
    blank = sum(step.get("format_error") == "empty_query" for step in steps)
    return {"question": record.get("question") or "", "queries": queries, "blank": blank}


def to_openrlhf(result: RolloutResult, label: Any, placement: str) -> dict[str, Any]:
    """The dict OpenRLHF's sample generator reads, plus ``step_rewards`` in step placement and the queries."""
    output = {
        "prompt": result.prompt,
        "label": label,
        "images": None,
        "mm_train_inputs": None,
        "reward": result.reward,
        "scores": result.score,
        "observation_tokens": result.observation_tokens,
        "action_ranges": result.action_ranges,
        "rollout_log_probs": result.rollout_log_probs,
        "truncated": result.truncated,
        "extra_logs": result.extra_logs,
        QUERIES_KEY: episode_queries(result.record),
    }
    if placement == "step":
        output[step_rewards.STEP_REWARDS_KEY] = result.step_rewards
    return output


class AgentExecutor(AgentExecutorBase):
    def __init__(
        self,
        config: RolloutConfig | None = None,
        search: Any = None,
        judge: Any = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        """``search``, ``judge``: in-process stand-ins for the services; ``clock``: the trainer's step, where known."""
        self.config = config or agent_config_from_environment()
        if self.config.reward.placement == "step" and not step_rewards.active():
            raise RuntimeError(
                "reward.placement is 'step' but r3rag's per-step reward extension is not installed in this Ray "
                "worker: launch with `python -m r3_env.openrlhf.train ...` (launch/ppo_r3.sh does), or set "
                'R3RAG_AGENT_OVERRIDES=\'{"reward.placement": "scalar"}\' for one reward per episode'
            )
        self._search, self._judge, self._clock = search, judge, clock
        self._context: RolloutContext | None = None

    def context(self, tokenizer: Any) -> RolloutContext:
        """The shared context, made on first use inside the rollout actor's event loop."""
        if self._context is None:
            context = RolloutContext(self.config, tokenizer, search=self._search, judge=self._judge, clock=self._clock)
            context.renderer.check_tokenization("Who wrote it?", context.renderer.format.express_turns(_SAMPLE_TURNS))
            self._context = context
        return self._context

    async def execute(self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None):
        if images:
            raise ValueError("r3rag's retrieval environment is text-only: drop --data.image_key")
        result = await run_episode(self.context(hf_tokenizer), llm_engine, prompt, label, sampling_params, max_length)
        return to_openrlhf(result, label, self.config.reward.placement)


# A two-step trajectory to check at start-up that the chat template tokenizes piecewise as it does whole.
_SAMPLE_TURNS = [
    Turn(Step("I need the author.", query="author of the book"), [Passage("d1", "The Book\nIt was written by Ann.")]),
    Turn(Step("The document names Ann.", answer="Ann")),
]
