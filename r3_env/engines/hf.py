"""A CPU generation engine on HF transformers behind the :class:`~r3_env.engines.base.TokenEngine` contract.

``await engine.generate(prompt_token_ids, sampling_params)`` returns an object shaped like vLLM's
``RequestOutput``: ``.outputs[0]`` has ``token_ids``, ``text``, ``finish_reason`` ("stop" or
"length") and, when ``sampling_params.logprobs`` is set, per-token ``logprobs``. Requests that
arrive while a batch runs wait for the next one, and up to ``max_batch`` of them run together
(left-padded ``model.generate``, in a worker thread so the event loop keeps serving episodes).

``script`` turns the engine into a constrained decoder for tests and benchmarks: given a
request's prompt ids it may return the token ids the model must emit (then the stop token).
The model still runs every forward pass; only its choice of token is forced.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from r3_env.engines.base import CompletionOutput, Logprob, RequestOutput

logger = logging.getLogger(__name__)

Script = Callable[[Sequence[int]], "Sequence[int] | None"]


@dataclass
class _Request:
    prompt: list[int]
    params: Any
    future: asyncio.Future


class HFEngine:
    """Batched ``generate`` over a causal LM on CPU (or one GPU)."""

    def __init__(self, model: Any, tokenizer: Any, max_batch: int = 32, script: Script | None = None) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.model, self.tokenizer, self.max_batch, self.script = model.eval(), tokenizer, max_batch, script
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._queue: list[_Request] = []
        self._worker: asyncio.Task | None = None
        self.busy_s = 0.0  # time inside model.generate: what evaluation compares its wall time with

    @classmethod
    def from_pretrained(cls, path: str, **options: Any) -> HFEngine:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        return cls(AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path), **options)

    async def generate(self, prompt_token_ids: Sequence[int], sampling_params: Any, **_: Any) -> RequestOutput:
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(list(prompt_token_ids), sampling_params, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._queue:
            batch: list[_Request] = []
            try:
                key = self._batch_key(self._queue[0].params)
                batch = [r for r in self._queue if self._batch_key(r.params) == key][: self.max_batch]
                taken = {id(r) for r in batch}
                self._queue = [r for r in self._queue if id(r) not in taken]
                started = time.perf_counter()
                outputs = await asyncio.to_thread(self._run, batch)
                self.busy_s += time.perf_counter() - started
            except Exception as error:  # every waiter learns of it; a request that cannot be batched fails alone
                for request in batch or [self._queue.pop(0)]:
                    if not request.future.done():
                        request.future.set_exception(error)
                continue
            for request, output in zip(batch, outputs, strict=True):
                if not request.future.done():
                    request.future.set_result(output)

    def _batch_key(self, params: Any) -> tuple:
        """Requests batch together when they sample alike and stop on the same tokens."""
        sampling = (float(params.temperature), float(params.top_p), int(params.top_k or -1))
        return (*sampling, getattr(params, "seed", None), tuple(sorted(self._stop_ids(params))))

    def _run(self, batch: list[_Request]) -> list[RequestOutput]:
        import torch
        from transformers import LogitsProcessorList

        params = batch[0].params
        width = max(len(r.prompt) for r in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, request in enumerate(batch):
            input_ids[row, width - len(request.prompt) :] = torch.tensor(request.prompt)
            attention[row, width - len(request.prompt) :] = 1
        input_ids, attention = input_ids.to(self.model.device), attention.to(self.model.device)
        stops = [self._stop_ids(r.params) for r in batch]
        limits = [max(1, int(r.params.max_tokens or 16)) for r in batch]
        processors = LogitsProcessorList()
        if self.script is not None:
            targets = [self.script(r.prompt) for r in batch]
            if any(t is not None for t in targets):
                ends = [
                    (list(getattr(r.params, "stop_token_ids", None) or []) + sorted(s))[0]
                    for r, s in zip(batch, stops, strict=True)
                ]
                processors.append(_ForceScript(targets, ends, width))
        greedy = float(params.temperature) <= 1e-5
        want_logprobs = any(getattr(r.params, "logprobs", None) is not None for r in batch)
        if getattr(params, "seed", None) is not None:
            torch.manual_seed(int(params.seed))
        with torch.no_grad():
            generated = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                max_new_tokens=max(limits),
                do_sample=not greedy,
                temperature=None if greedy else float(params.temperature),
                top_p=None if greedy else float(params.top_p),
                top_k=None if greedy or (params.top_k or -1) <= 0 else int(params.top_k),
                eos_token_id=sorted({t for s in stops for t in s}),
                pad_token_id=self.pad_id,
                logits_processor=processors,
                return_dict_in_generate=True,
                output_logits=want_logprobs,
            )
        new_tokens = generated.sequences[:, width:]
        logprobs = (
            torch.stack([torch.log_softmax(step.float(), dim=-1) for step in generated.logits], dim=1)
            if want_logprobs
            else None
        )
        outputs = []
        for row, request in enumerate(batch):
            tokens, reason = [], "length"
            for token in new_tokens[row, : limits[row]].tolist():
                tokens.append(token)
                if token in stops[row]:
                    reason = "stop"
                    break
            token_logprobs = None
            if logprobs is not None and getattr(request.params, "logprobs", None) is not None:
                token_logprobs = [{token: Logprob(float(logprobs[row, i, token]))} for i, token in enumerate(tokens)]
            text = self.tokenizer.decode(
                tokens, skip_special_tokens=bool(getattr(request.params, "skip_special_tokens", False))
            )
            outputs.append(RequestOutput(request.prompt, [CompletionOutput(tokens, text, reason, token_logprobs)]))
        return outputs

    def _stop_ids(self, params: Any) -> set[int]:
        stops = set(getattr(params, "stop_token_ids", None) or [])
        if self.tokenizer.eos_token_id is not None:
            stops.add(self.tokenizer.eos_token_id)
        return stops


class _ForceScript:
    """Logits processor: rows with a target emit it token by token, then their stop token."""

    def __init__(self, targets: list, ends: list[int], prompt_width: int) -> None:
        self.targets = [list(t) + [end] if t is not None else None for t, end in zip(targets, ends, strict=True)]
        self.prompt_width = prompt_width

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        position = input_ids.shape[1] - self.prompt_width
        for row, target in enumerate(self.targets):
            if target is None:
                continue
            token = target[min(position, len(target) - 1)]
            forced = scores[row].clone().fill_(float("-inf"))
            forced[token] = 0.0
            scores[row] = forced
        return scores
