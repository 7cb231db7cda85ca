"""Rollouts from a vLLM server, behind the :class:`~r3_env.engines.base.TokenEngine` contract.

vLLM pins its own torch, so it lives in an env of its own (``bash scripts/setup_vllm.sh``) and the
local PPO trainer reaches it over HTTP, as the agent reaches retrieval and the judge:

- ``generate`` sends the prompt as token ids to ``/v1/completions`` with ``return_token_ids`` and
  returns what vLLM's ``AsyncLLM.generate`` would (the sampled ids, the stop token included);
- ``reload`` has the server load new weights in place from an HF folder
  (``/collective_rpc reload_weights``, then ``/reset_prefix_cache``). Those endpoints exist only when
  the server runs with ``VLLM_SERVER_DEV_MODE=1``, and the folder must be readable by the server:
  the same machine or a shared filesystem. A reload of a 135M model takes about 2 s on CPU.

vLLM's reload refreshes the input embedding but leaves an output layer tied to it holding the old
weights, so the server must serve, and be sent, untied folders
(:func:`r3_env.train.models.save_policy` with ``untied=True``); a tied served model is refused.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from r3_env.engines.base import CompletionOutput, Logprob, RequestOutput
from r3_env.http_retry import AsyncHTTP, RequestFailed, RetryPolicy, asend_with_retries

DEV_MODE_HINT = "start the vLLM server with VLLM_SERVER_DEV_MODE=1 (it serves /collective_rpc only then)"
SERVER_HINT = "is a vLLM server there? (ppo.vllm_url; the demo's --rollout_engine vllm starts one)"
UNTIE_HINT = (
    "Serve an untied copy (r3_env.train.models.save_policy(model, tokenizer, folder, untied=True), as `r3rag demo "
    "--rollout_engine vllm` does)"
)


class VLLMServerError(RuntimeError):
    """The vLLM server failed a request for good, or cannot reload weights."""


class VLLMServerEngine:
    """Batched generation by a vLLM OpenAI-compatible server; vLLM batches the concurrent requests itself.

    ``url``: the server's root (``http://HOST:PORT``; a trailing ``/v1`` is accepted). ``busy_s``
    counts the wall time during which at least one request was in flight (retries included), the
    HF engine's ``busy_s`` for a server.
    """

    def __init__(self, url: str, timeout_s: float = 600.0, retries: int = 2, max_connections: int = 256) -> None:
        self.root = url.rstrip("/").removesuffix("/v1")
        self.http = AsyncHTTP(timeout_s, {}, max_connections)
        self.policy = RetryPolicy(retries=retries)
        self.model: str | None = None
        self.served_from = ""  # the folder (or hub name) the server loaded at start
        self.checked_untied = False
        self.busy_s = 0.0
        self._in_flight, self._since = 0, 0.0

    async def _post(self, path: str, payload: dict[str, Any]) -> Any:
        url = self.root + path
        try:
            reply = await asend_with_retries(lambda: self.http.post(url, payload), self.policy, url)
        except RequestFailed as failure:
            hint = DEV_MODE_HINT if failure.status == 404 and path != "/v1/completions" else ""
            hint = SERVER_HINT if failure.transport else hint
            raise VLLMServerError(f"{url}: {failure.detail}" + (f" ({hint})" if hint else "")) from None
        return reply.json() if reply.body else None

    async def served_model(self) -> str:
        """The name the server serves its model under (asked once)."""
        if self.model is None:
            url = self.root + "/v1/models"
            try:
                reply = await asend_with_retries(lambda: self.http.get(url), self.policy, url)
                served = reply.json()["data"][0]
                self.model, self.served_from = served["id"], served.get("root") or served["id"]
            except (RequestFailed, KeyError, IndexError) as error:
                raise VLLMServerError(f"{url} lists no served model ({error}): {SERVER_HINT}") from None
        return self.model

    async def generate(self, prompt_token_ids: Sequence[int], sampling_params: Any, **_: Any) -> RequestOutput:
        prompt = list(prompt_token_ids)
        body: dict[str, Any] = {
            "model": await self.served_model(),
            "prompt": prompt,
            "max_tokens": sampling_params.max_tokens,  # None: vLLM's default (16), as HFEngine's
            "temperature": float(sampling_params.temperature),
            "top_p": float(sampling_params.top_p),
            "top_k": int(getattr(sampling_params, "top_k", -1) or -1),
            "min_tokens": int(getattr(sampling_params, "min_tokens", 0) or 0),
            "stop_token_ids": list(getattr(sampling_params, "stop_token_ids", None) or []),
            "skip_special_tokens": bool(getattr(sampling_params, "skip_special_tokens", False)),
            "return_token_ids": True,
        }
        if getattr(sampling_params, "seed", None) is not None:
            body["seed"] = int(sampling_params.seed)
        if getattr(sampling_params, "logprobs", None) is not None:
            body["logprobs"] = int(sampling_params.logprobs)
        self._start()
        try:
            payload = await self._post("/v1/completions", body)
        finally:
            self._stop()
        try:
            choice = payload["choices"][0]
            token_ids = [int(t) for t in choice["token_ids"]]
            logprobs = None
            if "logprobs" in body:
                values = choice["logprobs"]["token_logprobs"]
                logprobs = [{t: Logprob(float(v))} for t, v in zip(token_ids, values, strict=True)]
            if choice["finish_reason"] not in ("stop", "length"):
                raise ValueError(f"finish_reason {choice['finish_reason']!r}")
            output = CompletionOutput(token_ids, choice["text"], choice["finish_reason"], logprobs)
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise VLLMServerError(f"{self.root}/v1/completions sent a malformed completion ({error!r})") from None
        return RequestOutput(prompt, [output])

    def _start(self) -> None:
        if self._in_flight == 0:
            self._since = time.perf_counter()
        self._in_flight += 1

    def _stop(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self.busy_s += time.perf_counter() - self._since

    async def reload(self, folder: Path | str) -> None:
        """Load the weights of the untied HF folder ``folder`` into the served model in place."""
        await self.http.close()  # the pooled connections idled through training: the server has dropped them
        await self.check_untied()
        await self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}})
        reset = await self._post("/reset_prefix_cache", {})  # cached prefixes hold the old weights' keys and values
        if isinstance(reset, dict) and reset.get("success") is False:
            raise VLLMServerError(f"{self.root} kept its prefix cache after a reload (requests still running?)")

    async def check_untied(self) -> None:
        """Refuse a served model whose output layer is (or may be) tied to its input embedding; checked once."""
        if self.checked_untied:
            return
        from transformers import AutoConfig

        await self.served_model()
        try:
            config = AutoConfig.from_pretrained(self.served_from)
        except (OSError, ValueError) as error:
            raise VLLMServerError(
                f"cannot read the config of {self.served_from}, which the vLLM server at {self.root} serves ({error}), "
                f"to check that its output layer is untied (a tied one would keep its old weights). {UNTIE_HINT}"
            ) from None
        if getattr(config, "tie_word_embeddings", False):
            raise VLLMServerError(
                f"the vLLM server at {self.root} serves {self.served_from}, whose output layer is tied to its input "
                f"embedding: vLLM's in-place reload would leave that layer with the old weights. {UNTIE_HINT}"
            )
        self.checked_untied = True

    async def aclose(self) -> None:
        await self.http.close()
