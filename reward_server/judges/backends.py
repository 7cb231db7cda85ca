"""Chat backends for the LLM judge: an OpenAI-compatible endpoint, or a transformers model in process."""

from __future__ import annotations

import asyncio
import logging
import threading
from abc import ABC, abstractmethod
from typing import Any

from r3_env.chat_client import ChatEndpointError, OpenAIChat
from r3_env.http_retry import TRANSPORT_ERRORS
from reward_server.config import JUDGE_API_KEY_ENV

logger = logging.getLogger(__name__)


class JudgeUnavailable(RuntimeError):
    """The judge could not be asked (down, timing out, failing, or rejecting the request)."""


class ChatBackend(ABC):
    """Turns chat messages into the judge's reply text."""

    model_id: str  # names the judge in results, metrics and cache keys

    @abstractmethod
    async def chat(self, messages: list[dict[str, str]]) -> str: ...

    async def check(self) -> dict[str, Any]:
        """Whether the judge can be reached, and serves the configured model."""
        return {"reachable": True}

    async def close(self) -> None:  # noqa: B027 - backends without connections have nothing to close
        pass


class OpenAIChatBackend(ChatBackend):
    """POST {base_url}/chat/completions, as ``vllm serve`` and any OpenAI-compatible server expose it.

    The request goes through :class:`r3_env.chat_client.OpenAIChat`: connection errors, timeouts,
    429 and 5xx are retried ``retries`` times with exponential backoff; other 4xx answers (a wrong
    model name, say) fail at once.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str = "",
        timeout_s: float = 60.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        temperature: float = 0.0,
        max_tokens: int = 256,
        max_connections: int = 64,
    ) -> None:
        self.client = OpenAIChat(
            base_url,
            model,
            JUDGE_API_KEY_ENV,
            timeout_s,
            retries,
            backoff_s,
            max_connections=max_connections,
            api_key=api_key,
        )
        self.url, self.model, self.model_id = self.client.url, model, f"openai:{model}"
        self.temperature, self.max_tokens = temperature, max_tokens

    async def chat(self, messages: list[dict[str, str]]) -> str:
        try:
            return (await self.client.complete(messages, self.temperature, self.max_tokens)).text
        except ChatEndpointError as error:
            raise JudgeUnavailable(f"judge at {error}") from None

    async def check(self) -> dict[str, Any]:
        models_url = self.client.base_url + "/models"
        try:
            reply = await self.client.http.get(models_url, timeout=10)
            names = [m.get("id") for m in reply.json().get("data", [])] if reply.status == 200 else None
        except (*TRANSPORT_ERRORS, ValueError) as error:
            return {"reachable": False, "error": f"{type(error).__name__}: {error}"}
        if names is None:
            return {"reachable": True, "model_listed": None, "error": f"{models_url}: HTTP {reply.status}"}
        return {"reachable": True, "model_listed": self.model in names, "models": names[:20]}

    async def close(self) -> None:
        await self.client.aclose()


class LocalHFBackend(ChatBackend):
    """A transformers causal LM in this process, greedy decoding, one request at a time (a worker thread)."""

    def __init__(self, model_path: str, device: str = "auto", max_tokens: int = 256) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from r3_env.retrieval.encoder import resolve_device

        self.device = resolve_device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        dtype = torch.bfloat16 if self.device != "cpu" else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(self.device).eval()
        self.model_id = f"local:{model_path}"
        self.max_tokens = max_tokens
        self._lock = threading.Lock()

    def _generate(self, messages: list[dict[str, str]]) -> str:
        import torch

        if self.tokenizer.chat_template:
            prompt = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            prompt = "\n\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\n\nassistant: "
        inputs = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(self.device)
        with self._lock, torch.inference_mode():
            output = self.model.generate(
                **inputs,
                max_new_tokens=self.max_tokens,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
            )
        return self.tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)

    async def chat(self, messages: list[dict[str, str]]) -> str:
        try:
            return await asyncio.to_thread(self._generate, messages)
        except Exception as error:  # a model failure is a judge failure: flagged, never raised to the trainer
            raise JudgeUnavailable(f"local judge {self.model_id} failed: {type(error).__name__}: {error}") from error
