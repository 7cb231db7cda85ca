"""Cold-start SFT on one machine: OpenRLHF's SFT dataset and loss, a plain torch loop.

The data is ``r3rag coldstart sft-data``'s transcript form (``{"messages": [...]}``), read by
OpenRLHF's own ``SFTDataset`` in multi-turn mode, so the loss falls on the policy's steps and
never on the documents, with the tokens the RL environment builds for the same trajectory. The
chat template is the policy's (``policy.chat_template``, as in RL). The loss is OpenRLHF's
``SFTLoss`` over ``Actor`` log-probs, averaged over the tokens of each optimizer step as OpenRLHF
does across its micro-batches. OpenRLHF drives the step through DeepSpeed (GPU only); the loop
here (accumulate, clip, AdamW, cosine schedule) is the local trainer's own.

An epoch ends with a checkpoint (``sft/checkpoint.pt``); a rerun resumes after the last one.
The trained policy is written to ``sft/policy`` with ``sft/done.json`` beside it.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from tqdm import tqdm

from r3_env.protocol import ChatRenderer
from r3_env.rollout_config import RolloutConfig
from r3_env.train import openrlhf_cpu
from r3_env.train.config import ModelConfig, RunConfig, SFTConfig
from r3_env.train.metrics import MetricsLog
from r3_env.train.models import (
    CHECKPOINT_FILE,
    DONE_FILE,
    finished,
    load_actor,
    load_state,
    load_tokenizer,
    make_optimizer,
    pick_device,
    rng_state,
    save_policy,
    save_state,
    set_rng_state,
)

logger = logging.getLogger(__name__)


def sft_dataset(path: str, tokenizer: Any, max_len: int, chat_template: str | None, field: str = "sft.data") -> Any:
    """OpenRLHF's SFTDataset over a transcript-form file (multi-turn: loss on every assistant turn); ``field`` is the
    setting that named the file, for the errors."""
    return transcript_dataset(read_transcripts(path, field), tokenizer, max_len, chat_template)


def read_transcripts(path: str, field: str) -> Any:
    """The rows of a transcript-form file (a ``datasets.Dataset``); ``field`` names the setting, for the errors."""
    openrlhf_cpu.enable()
    from datasets import load_dataset

    if not Path(path).is_file():
        raise FileNotFoundError(f"{field} {path} does not exist: write it with r3rag coldstart sft-data")
    rows = load_dataset("json", data_files=str(path), split="train")
    if "messages" not in rows.column_names:
        raise ValueError(
            f"{field} {path} has no 'messages' column: make it with r3rag coldstart sft-data --form transcript "
            "(the per_step form is for OpenRLHF's cluster SFT)"
        )
    return rows


def transcript_dataset(rows: Any, tokenizer: Any, max_len: int, chat_template: str | None) -> Any:
    """OpenRLHF's SFTDataset in multi-turn mode over transcript rows (it drops those longer than ``max_len``)."""
    from openrlhf.datasets import SFTDataset

    data = SimpleNamespace(
        input_key="messages", output_key=None, apply_chat_template=True, tokenizer_chat_template=chat_template
    )
    return SFTDataset(
        rows, tokenizer, max_len, SimpleNamespace(args=SimpleNamespace(data=data)), num_processors=1, multiturn=True
    )


def run_sft(run: RunConfig, model: ModelConfig, sft: SFTConfig, rollout: RolloutConfig, metrics: MetricsLog) -> Path:
    """Fine-tune ``model.policy`` on ``sft.data``; returns the trained policy's folder."""
    openrlhf_cpu.enable()
    from openrlhf.models import SFTLoss

    folder = Path(run.out) / "sft"
    final = folder / "policy"
    if finished(folder):
        logger.info("SFT already finished: %s", final)
        return final
    device = pick_device(run.device)
    tokenizer = load_tokenizer(model.policy)
    renderer = ChatRenderer(tokenizer, rollout.policy.step_format, rollout.policy.chat_template)
    dataset = sft_dataset(sft.data, tokenizer, sft.max_len, renderer.template)
    if len(dataset) == 0:
        raise ValueError(f"sft.data {sft.data} holds no examples")
    actor = load_actor(model.policy, model, device)
    steps_per_epoch = math.ceil(len(dataset) / sft.batch_size)
    optimizer, scheduler = make_optimizer(
        actor, sft.lr, steps_per_epoch * sft.epochs, sft.lr_warmup_ratio, sft.min_lr_ratio
    )
    checkpoint = folder / CHECKPOINT_FILE
    state = load_state(checkpoint)
    epoch, step = 0, 0
    if state is not None:
        actor.model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        epoch, step = state["epoch"], state["step"]
        set_rng_state(state["rng"])
        logger.info("SFT resumes after epoch %d (step %d) from %s", epoch, step, checkpoint)
    loss_fn = SFTLoss()
    logger.info(
        "SFT: %d examples, %d epochs, %d steps per epoch on %s", len(dataset), sft.epochs, steps_per_epoch, device
    )
    while epoch < sft.epochs:
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(run.seed + epoch)).tolist()
        bar = tqdm(range(0, len(order), sft.batch_size), desc=f"SFT epoch {epoch + 1}/{sft.epochs}", unit="step")
        for start in bar:
            started = time.perf_counter()
            items = [dataset[i] for i in order[start : start + sft.batch_size]]
            loss_value, tokens = sft_backward(actor, dataset, items, sft.micro_batch_size, loss_fn, device)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(actor.parameters(), sft.max_norm))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            elapsed = time.perf_counter() - started
            values = {
                "loss": loss_value,
                "lr": scheduler.get_last_lr()[0],
                "grad_norm": grad_norm,
                "tokens": tokens,
                "tokens_per_s": tokens / elapsed,
                "epoch": epoch + 1,
            }
            metrics.log("sft", step, values)
            bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{tokens / elapsed:.0f}")
        epoch += 1
        save_state(
            checkpoint,
            {
                "model": actor.model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "epoch": epoch,
                "step": step,
                "rng": rng_state(),
            },
        )
    save_policy(actor.model, tokenizer, final)
    (folder / DONE_FILE).write_text(json.dumps({"examples": len(dataset), "epochs": sft.epochs, "steps": step}) + "\n")
    checkpoint.unlink(missing_ok=True)  # the finished policy supersedes it
    logger.info("SFT done: %d steps -> %s", step, final)
    return final


def sft_backward(
    actor: Any, dataset: Any, items: list, micro_batch_size: int, loss_fn: Any, device: torch.device, scale: float = 1.0
) -> tuple[float, int]:
    """Accumulate ``scale`` times the SFT loss of ``items`` (the mean over all their trained tokens) into the
    gradients; returns that loss, unscaled, and its token count. PPO's ``ppo.ptx_data`` adds it to actor steps."""
    actor.train()
    items = sorted(items, key=lambda item: item[0].shape[-1])  # similar lengths share a micro-batch: less padding
    batch_tokens = sum(float(mask[:, :-1].sum()) for _, _, mask in items)
    total = 0.0
    for start in range(0, len(items), micro_batch_size):
        input_ids, attention_mask, loss_mask = dataset.collate_fn(items[start : start + micro_batch_size])
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        loss_mask = loss_mask.to(device)[:, :-1]
        log_probs = actor(input_ids, attention_mask=attention_mask, return_logprobs=True)
        share = float(loss_mask.sum()) / max(batch_tokens, 1.0)
        loss = loss_fn(log_probs, loss_mask) * share
        (loss * scale).backward()
        total += float(loss.detach())
    return total, int(batch_tokens)
