"""Inference engines for evaluation: one ``chat(messages)`` call over vLLM, HF transformers or an endpoint.

Every method (the step-by-step policy and the baselines) talks to the model through chat
messages. The token engines (``vllm`` offline on GPU, ``hf`` on CPU or one GPU) apply the chat
template themselves with :class:`r3_env.protocol.ChatRenderer`, the renderer and template RL
uses (earlier steps are re-rendered from their parsed form, so stray whitespace a policy wrote
is normalised, where RL keeps its raw tokens); ``openai`` sends the messages to any
OpenAI-compatible server (vLLM serving an official R3-RAG checkpoint, a hosted model) and lets
it apply its template.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from r3_env.chat_client import ChatReply, OpenAIChat
from r3_env.protocol import ChatRenderer, MessageRenderer, StepFormat

logger = logging.getLogger(__name__)


DTYPES = ("auto", "bfloat16", "float16", "float32")


@dataclass(frozen=True)
class EngineConfig:
    """Which model answers, and how it is run."""

    kind: Literal["hf", "vllm", "openai"] = field(
        default="hf", metadata={"help": "hf (transformers, CPU or one GPU), vllm (offline, GPU) or openai (endpoint)"}
    )
    model: str = field(default="", metadata={"help": "model folder or hub name (hf, vllm); served name (openai)"})
    chat_template: str = field(
        default="auto", metadata={"help": "hf/vllm: auto (the tokenizer's), plain, or a Jinja template (as in RL)"}
    )
    base_url: str = field(default="", metadata={"help": "openai: endpoint base URL, e.g. http://127.0.0.1:8001/v1"})
    api_key_env: str = field(default="OPENAI_API_KEY", metadata={"help": "openai: variable holding the API key"})
    max_model_len: int = field(default=8192, metadata={"help": "hf/vllm: context tokens (prompt + generation)"})
    max_batch: int = field(default=32, metadata={"help": "hf: sequences per generate call"})
    dtype: str = field(default="auto", metadata={"help": "hf/vllm: auto, bfloat16, float16 or float32"})
    tensor_parallel_size: int = field(default=1, metadata={"help": "vllm: GPUs per engine"})
    gpu_memory_utilization: float = field(default=0.85, metadata={"help": "vllm: share of GPU memory to use"})
    enforce_eager: bool = field(default=False, metadata={"help": "vllm: no CUDA graphs / compilation (faster start)"})
    timeout_s: float = field(default=300.0, metadata={"help": "openai: per request"})
    retries: int = field(default=3, metadata={"help": "openai: per request"})
    requests_per_minute: float = field(default=0.0, metadata={"help": "openai: rate limit (0: none)"})

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("engine.model is required: a model folder or hub name, or the served model's name")
        if self.kind == "openai" and not self.base_url:
            raise ValueError("engine.kind openai needs engine.base_url (e.g. http://127.0.0.1:8001/v1)")
        if self.max_model_len < 16 or self.max_batch < 1 or self.tensor_parallel_size < 1:
            raise ValueError("max_model_len must be at least 16, max_batch and tensor_parallel_size at least 1")
        if self.dtype not in DTYPES:
            raise ValueError(f"engine.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"engine.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")


@dataclass(frozen=True)
class GenerationConfig:
    """Sampling. The paper's protocol is greedy decoding."""

    temperature: float = field(default=0.0, metadata={"help": "0: greedy"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling"})
    seed: int = field(default=0, metadata={"help": "sampling seed"})

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("temperature must be 0 or more and top_p in (0, 1]")


@dataclass(frozen=True)
class Completion(ChatReply):
    """A generated turn and, when asked for, the probability of each generated token."""

    token_probs: tuple[float, ...] | None = None


class EngineError(RuntimeError):
    """The engine could not generate (an endpoint failed for good)."""


class ChatEngine(ABC):
    """Generates one assistant turn from chat messages (evaluation's engines; token-level generation is
    :class:`r3_env.engines.TokenEngine`)."""

    name: str
    system_in_user: bool = False  # the chat template has no system role: instructions lead the first user turn
    busy_s: float | None = None  # time the model spent generating, where the engine can tell

    @abstractmethod
    def renderer(self, step_format: str | StepFormat, doc_chars: int) -> MessageRenderer:
        """The renderer whose messages this engine turns into exactly the policy's training prompt."""

    @abstractmethod
    async def chat(self, messages: Sequence[dict[str, str]], max_tokens: int, stop: Sequence[str] = ()) -> ChatReply:
        """The next assistant turn; text is cut before the first of ``stop``. A last assistant message is a turn
        already started (``EnvConfig.answer_at_limit``): the reply is its continuation."""

    async def aclose(self) -> None:  # noqa: B027 - most engines hold nothing to release
        pass


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` before the earliest stop string, and whether one was found."""
    positions = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return (text[: min(positions)], True) if positions else (text, False)


class TokenChatEngine(ChatEngine):
    """Chat over a local :class:`r3_env.engines.TokenEngine` (``HFEngine`` or ``VLLMOfflineEngine``)."""

    def __init__(
        self,
        generator: Any,
        tokenizer: Any,
        chat_template: str,
        generation: GenerationConfig,
        max_model_len: int,
        name: str,
        make_params: Any,
    ) -> None:
        self.generator, self.tokenizer, self.chat_template = generator, tokenizer, chat_template
        self.generation, self.max_model_len, self.name = generation, max_model_len, name
        self.make_params = make_params
        self._template = ChatRenderer(tokenizer, "r3", chat_template)
        self.system_in_user = self._template.system_in_user
        self.stop_token_ids = self._template.stop_token_ids
        self._special = set(getattr(tokenizer, "all_special_ids", []))

    @property
    def busy_s(self) -> float | None:
        return getattr(self.generator, "busy_s", None)

    def renderer(self, step_format: str | StepFormat, doc_chars: int) -> MessageRenderer:
        return ChatRenderer(self.tokenizer, step_format, self.chat_template, doc_chars=doc_chars)

    async def chat(self, messages: Sequence[dict[str, str]], max_tokens: int, stop: Sequence[str] = ()) -> ChatReply:
        started = messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else ""
        head = messages[:-1] if started else messages
        return await self.complete(self._template.generation_prompt(head) + started, max_tokens, stop)

    async def complete(
        self, prompt: str, max_tokens: int, stop: Sequence[str] = (), token_probs: bool = False
    ) -> Completion:
        """A raw continuation of ``prompt`` (FlashRAG's pipelines build their own prompt strings).

        ``token_probs``: also return each generated token's probability (FLARE's confidence test).
        """
        ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        room = self.max_model_len - len(ids)
        if room <= 0:  # the conversation outgrew the context: nothing more can be generated
            logger.warning("prompt of %d tokens fills the %d-token context", len(ids), self.max_model_len)
            return Completion("", finished=False, prompt_tokens=len(ids))
        params = self.make_params(
            temperature=self.generation.temperature,
            top_p=self.generation.top_p if self.generation.temperature > 0 else 1.0,
            max_tokens=min(max_tokens, room),
            stop_token_ids=list(self.stop_token_ids),
            seed=self.generation.seed,
            logprobs=1 if token_probs else None,
        )
        output = (await self.generator.generate(ids, params)).outputs[0]
        tokens = list(output.token_ids)
        finished = output.finish_reason == "stop"
        body = tokens[:-1] if finished and tokens and tokens[-1] in self._special else tokens
        text, stopped = cut_at_stop(self.tokenizer.decode(body, skip_special_tokens=False), stop)
        probs = None
        if token_probs:
            chosen = [
                entry.get(token) if entry else None for token, entry in zip(tokens, output.logprobs or [], strict=False)
            ]
            probs = tuple(math.exp(getattr(item, "logprob", item)) if item is not None else 0.0 for item in chosen)
        return Completion(text, finished or stopped, len(ids), len(tokens), probs)

    async def aclose(self) -> None:
        shutdown = getattr(self.generator, "shutdown", None)
        if shutdown is not None:
            shutdown()


class OpenAIChatEngine(ChatEngine):
    """A model behind an OpenAI-compatible chat endpoint; the server applies its chat template.

    A request the endpoint rejects for good (or a reply with no text) is an :class:`EngineError`: the
    question is not written and the next run retries it.
    """

    def __init__(self, config: EngineConfig, generation: GenerationConfig, max_connections: int = 64) -> None:
        self.generation, self.name = generation, config.model
        self.client = OpenAIChat(
            config.base_url,
            config.model,
            config.api_key_env,
            config.timeout_s,
            config.retries,
            requests_per_minute=config.requests_per_minute,
            max_connections=max_connections,
        )

    def renderer(self, step_format: str | StepFormat, doc_chars: int) -> MessageRenderer:
        return MessageRenderer(step_format, doc_chars=doc_chars)

    async def chat(self, messages: Sequence[dict[str, str]], max_tokens: int, stop: Sequence[str] = ()) -> ChatReply:
        from r3_env.chat_client import ChatEndpointError

        if messages and messages[-1]["role"] == "assistant":
            raise ValueError("an OpenAI-compatible endpoint does not continue a started assistant turn: "
                             "env.answer_at_limit needs a local engine (--engine.kind hf or vllm)")  # fmt: skip
        try:
            reply = await self.client.complete(
                messages,
                self.generation.temperature,
                max_tokens,
                top_p=self.generation.top_p,
                stop=stop,
                seed=self.generation.seed,
            )
        except ChatEndpointError as error:
            raise EngineError(f"engine {error}") from None
        return reply  # busy_s stays None: concurrent requests overlap, and the server's own time is unknown

    async def aclose(self) -> None:
        await self.client.aclose()


def _hf_model(config: EngineConfig) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = "auto" if config.dtype == "auto" else getattr(torch, config.dtype)
    model = AutoModelForCausalLM.from_pretrained(config.model, dtype=dtype)
    if torch.cuda.is_available():
        model = model.to("cuda")
    return model, AutoTokenizer.from_pretrained(config.model)


def make_chat_engine(config: EngineConfig, generation: GenerationConfig, max_connections: int = 64) -> ChatEngine:
    """The engine a config describes (the model loads here)."""
    if config.kind == "openai":
        return OpenAIChatEngine(config, generation, max_connections)
    if config.kind == "hf":
        from r3_env.engines import HFEngine, SamplingParams

        model, tokenizer = _hf_model(config)
        generator = HFEngine(model, tokenizer, max_batch=config.max_batch)
        return TokenChatEngine(
            generator, tokenizer, config.chat_template, generation, config.max_model_len, config.model, SamplingParams
        )
    from transformers import AutoTokenizer
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.platforms import current_platform

    from r3_env.engines import VLLMOfflineEngine

    # vLLM's CPU worker cannot rewind a seeded request's generator ("CPU Generator does not use offset",
    # an EngineDeadError mid-run): there, sampling draws from the engine's seeded generator instead
    per_request_seed = not current_platform.is_cpu()

    def vllm_params(**values: Any) -> Any:
        if not per_request_seed:
            values.pop("seed", None)
        return VLLMSamplingParams(**values, skip_special_tokens=False)

    names = ("dtype", "tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "enforce_eager")
    options = {name: getattr(config, name) for name in names}
    generator = VLLMOfflineEngine(config.model, seed=generation.seed, **options)
    tokenizer = AutoTokenizer.from_pretrained(config.model)
    return TokenChatEngine(
        generator, tokenizer, config.chat_template, generation, config.max_model_len, config.model, vllm_params
    )
