"""Policy, critic and reference as OpenRLHF's own model classes, on one device, plus optimizers and checkpoints.

The policy is OpenRLHF's :class:`openrlhf.models.Actor` around a transformers causal LM (loaded
here in the configured dtype: OpenRLHF's loader knows bf16 and fp16 only, and CPU training wants
fp32). The critic is OpenRLHF's ``get_llm_for_sequence_regression(..., "critic")`` (its loader
reads bf16/fp16, so the critic is loaded in bf16 and cast; a resumed critic gets its exact
weights back from the checkpoint). Optimizers follow OpenRLHF's defaults: AdamW with betas
(0.9, 0.95) and a cosine schedule with warm-up down to a minimum rate. OpenRLHF builds these
through DeepSpeed, which needs a GPU; the plain torch equivalents here are the local trainer's own.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from r3_env.train import openrlhf_cpu
from r3_env.train.config import ModelConfig

logger = logging.getLogger(__name__)

DONE_FILE = "done.json"  # a stage folder holding it is finished: a rerun skips the stage
CHECKPOINT_FILE = "checkpoint.pt"  # in a stage folder: the state a rerun resumes from, until the final policy is saved


def finished(stage_folder: Path | str) -> bool:
    """Whether the stage written to ``stage_folder`` (``RUN/sft``, ``RUN/ppo``) has finished."""
    return (Path(stage_folder) / DONE_FILE).is_file()


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def pick_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device is cuda but torch sees no GPU: use --device cpu (or auto)")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_actor(path: str, config: ModelConfig, device: torch.device, trainable: bool = True) -> Any:
    """OpenRLHF's Actor around ``path``'s causal LM, in ``config.dtype`` on ``device``.

    With ``config.lora_rank`` a trainable actor gets peft LoRA adapters as OpenRLHF's Actor adds them
    when it loads a model itself (it adds none to a model handed to it); a frozen one (the reference) none.
    """
    openrlhf_cpu.enable()
    from openrlhf.models import Actor
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=DTYPES[config.dtype], attn_implementation=config.attn_implementation
    ).to(device)
    model.config.use_cache = False  # as OpenRLHF's Actor sets it; generate() keeps its own cache setting
    if trainable and config.lora_rank > 0:
        from peft import LoraConfig, TaskType, get_peft_model

        modules = config.target_modules if config.target_modules == "all-linear" else config.target_modules.split(",")
        model.enable_input_require_grads()
        lora = LoraConfig(
            task_type=TaskType.CAUSAL_LM,
            r=config.lora_rank,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=modules,
            bias="none",
        )
        model = get_peft_model(model, lora)
        trained, total = model.get_nb_trainable_parameters()
        logger.info("LoRA rank %d on %s: %d of %d parameters train", config.lora_rank, modules, trained, total)
    if trainable and config.trainable_layers:
        freeze_below(model, config.trainable_layers)
    if autocast_in_bf16(config.mixed_precision, device):
        autocast_bf16(model)
    actor = Actor(model)
    actor.packing_samples = False  # Actor sets it only when it loads the model itself (in bf16/fp16)
    if config.gradient_checkpointing:
        actor.gradient_checkpointing_enable()
    return actor


def freeze_below(model: torch.nn.Module, trainable_layers: int) -> None:
    """Train only the last ``trainable_layers`` decoder layers and the final norm; everything below (and the
    embeddings, tied or not to the LM head) is frozen, so backward never reaches it."""
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"model.trainable_layers: {type(model).__name__}'s decoder has no .layers to choose from")
    if trainable_layers > len(layers):
        raise ValueError(f"model.trainable_layers: {trainable_layers} is more than the model's {len(layers)} layers")
    model.requires_grad_(False)
    for module in (*layers[len(layers) - trainable_layers :], getattr(decoder, "norm", None)):
        if module is not None:
            module.requires_grad_(True)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    logger.info("training the last %d of %d layers: %d of %d parameters", trainable_layers, len(layers), trained, total)


def autocast_bf16(model: torch.nn.Module) -> None:
    """Run ``model``'s forward under bf16 autocast (weights, gradients and optimizer stay fp32): mixed
    precision as OpenRLHF's ``--bf16`` gives it on GPU. OpenRLHF's Actor casts the logits back to fp32."""
    device_type = next(model.parameters()).device.type
    if device_type == "cpu" and not native_cpu_bf16():
        logger.warning(
            "model.mixed_precision bf16: this CPU has no native bf16 (AVX512-BF16 or AMX), so autocast emulates "
            "it and can be slower than fp32 (bench/sft_speed.py compares them here); consider "
            "model.mixed_precision no"
        )
    model.forward = torch.autocast(device_type, dtype=torch.bfloat16)(model.forward)


def autocast_in_bf16(mixed_precision: str, device: torch.device) -> bool:
    """Whether ``model.mixed_precision`` puts the forward under bf16 autocast on ``device``. ``auto`` does where
    the hardware computes bf16 natively: a CPU without it emulates bf16, on one core (on an AVX2 machine the
    quick demo's one SFT step of 5 examples ran over 5 minutes under bf16, and its SFT stage 62 s in fp32)."""
    if mixed_precision != "auto":
        return mixed_precision == "bf16"
    if device.type != "cpu":
        native, where = device.type == "cuda", device.type
    else:
        native = native_cpu_bf16()
        where = f"CPU {'with' if native else 'without'} native bf16"
    logger.info("model.mixed_precision auto: %s on this %s", "bf16" if native else "no (fp32)", where)
    return native


def native_cpu_bf16() -> bool:
    """Whether oneDNN computes bf16 natively on this CPU (AVX512-BF16 or AMX); True when torch cannot say."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return True if check is None else bool(check())


def load_critic(path: str, config: ModelConfig, device: torch.device) -> Any:
    """OpenRLHF's critic (the causal LM's body and a new value head) from ``path``."""
    openrlhf_cpu.enable()
    from openrlhf.models import get_llm_for_sequence_regression

    critic = get_llm_for_sequence_regression(
        path,
        "critic",
        param_dtype="bf16",
        attn_implementation=config.attn_implementation,
        init_value_head=True,
        value_head_prefix="score",
    )
    critic = critic.to(device=device, dtype=DTYPES[config.dtype])
    if config.gradient_checkpointing:
        critic.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return critic


def make_optimizer(
    module: torch.nn.Module, lr: float, total_steps: int, warmup_ratio: float = 0.03, min_lr_ratio: float = 0.1
) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW and OpenRLHF's default schedule (cosine_with_min_lr, warm-up share of the steps)."""
    from transformers import get_scheduler

    optimizer = torch.optim.AdamW(
        [p for p in module.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.95), weight_decay=0.0
    )
    scheduler = get_scheduler(
        "cosine_with_min_lr",
        optimizer,
        num_warmup_steps=int(total_steps * warmup_ratio),
        num_training_steps=max(total_steps, 1),
        scheduler_specific_kwargs={"min_lr": lr * min_lr_ratio},
    )
    return optimizer, scheduler


def save_policy(model: Any, tokenizer: Any, folder: Path, untied: bool = False) -> Path:
    """Write an HF folder whole (a temporary folder renamed into place), so a reader never sees half of one.

    A LoRA-trained model is saved merged (a plain HF folder the next stage, evaluation and vLLM load
    as they are); the model in training keeps its adapters. ``untied``: an output layer tied to the
    input embedding is written as a tensor of its own (``tie_word_embeddings`` false), the form a vLLM
    server must serve to reload weights in place: vLLM's reload refreshes the embedding but leaves a
    tied output layer holding the old weights.
    """
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if hasattr(model, "merge_and_unload"):  # a peft model
        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if untied and getattr(model.config, "tie_word_embeddings", False):
        _untie(model, tmp)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder


def _untie(model: Any, folder: Path) -> None:
    """Give the saved ``folder`` of a tied ``model`` its output layer's weight and an untied config."""
    import json

    from safetensors.torch import load_file, save_file

    files = sorted(folder.glob("*.safetensors"))
    if len(files) != 1:
        raise ValueError(
            f"untying needs a single-file checkpoint; {folder} has {len(files)} safetensors files (save_pretrained "
            "shards above its max_shard_size, 50GB by default: raise it for a model this large)"
        )
    modules = {module: name for name, module in model.named_modules()}
    embedding = modules[model.get_input_embeddings()] + ".weight"
    output = modules[model.get_output_embeddings()] + ".weight"
    tensors = load_file(files[0])
    tensors[output] = tensors[embedding].clone()
    save_file(tensors, files[0], metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def save_state(path: Path, state: dict[str, Any]) -> None:
    """A checkpoint file written whole, then renamed over the previous one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_state(path: Path) -> dict[str, Any] | None:
    path = Path(path)
    return torch.load(path, map_location="cpu", weights_only=False) if path.is_file() else None


def rng_state() -> dict[str, Any]:
    import random

    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    import random

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
