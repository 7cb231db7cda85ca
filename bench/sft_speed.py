"""How fast one SFT step of a policy runs under each way of training it, measured in one run.

    python bench/sft_speed.py [--policy smollm2-135m-instruct] [--tokens 750] [--micro_batch 2] [--repeats 3]

Builds the policy as the local trainer does (``r3_env.train.models.load_actor``) once per variant:
full fp32, bf16 autocast (``model.mixed_precision bf16``), the last N layers only
(``model.trainable_layers``), both, and LoRA rank 16, and times forward and backward of OpenRLHF's SFT
loss over a micro-batch of random tokens (the demo's transcripts average about 750 SmolLM2 tokens).
Prints seconds per micro-batch, tokens per second and each variant's speed-up over full fp32; the
fastest of ``--repeats`` timed passes counts, after one warm-up pass. Run it alone: two torch jobs on
two cores slow each other several times over.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

logger = logging.getLogger("sft_speed")


def variants(layers: int) -> dict[str, dict]:
    return {
        "full fp32": {},
        "bf16 autocast": {"mixed_precision": "bf16"},
        f"last {layers} layers": {"trainable_layers": layers},
        f"bf16 + last {layers} layers": {"mixed_precision": "bf16", "trainable_layers": layers},
        "LoRA rank 16": {"lora_rank": 16},
    }


def time_step(policy: str, settings: dict, tokens: int, micro_batch: int, repeats: int) -> float:
    """The fastest of ``repeats`` forward-and-backward passes of the SFT loss (after a warm-up)."""
    import torch

    from r3_env.train import openrlhf_cpu
    from r3_env.train.config import ModelConfig
    from r3_env.train.models import load_actor

    openrlhf_cpu.enable()
    from openrlhf.models import SFTLoss

    actor = load_actor(policy, ModelConfig(policy=policy, **settings), torch.device("cpu"))
    actor.train()
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, actor.model.config.vocab_size, (micro_batch, tokens), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    loss_mask = torch.ones(micro_batch, tokens - 1)
    loss_fn, times = SFTLoss(), []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        log_probs = actor(input_ids, attention_mask=attention_mask, return_logprobs=True)
        loss_fn(log_probs, loss_mask).backward()
        actor.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
    return min(times[1:])


def add_step_arguments(parser: argparse.ArgumentParser, layers: int, repeats: int) -> None:
    """The micro-batch :func:`time_step` times, as flags (bench/cpu_malloc.py times the same one)."""
    parser.add_argument("--policy", default="smollm2-135m-instruct", help="a registry model or an HF model folder")
    parser.add_argument("--tokens", type=int, default=750, help="tokens per sequence")
    parser.add_argument("--micro_batch", type=int, default=2, help="sequences per forward pass")
    parser.add_argument("--layers", type=int, default=layers, help="trainable_layers of the partial variants")
    parser.add_argument("--repeats", type=int, default=repeats, help="timed passes per variant (the fastest counts)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(parser, layers=10, repeats=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    from r3_env.model_registry import MODELS, get_model

    with tempfile.TemporaryDirectory() as scratch:
        policy = args.policy
        if policy in MODELS:
            policy = str(get_model(policy, Path(scratch) / "policy"))
        results = {}
        for name, settings in variants(args.layers).items():
            results[name] = time_step(policy, settings, args.tokens, args.micro_batch, args.repeats)
            logger.info("%s: %.2f s per micro-batch", name, results[name])
    tokens = args.tokens * args.micro_batch
    base = results["full fp32"]
    shape = f"{args.policy}, {args.micro_batch} x {args.tokens} tokens"
    print(f"| variant ({shape}) | s per micro-batch | tokens/s | speed-up |")
    print("|---|---|---|---|")
    for name, seconds in results.items():
        print(f"| {name} | {seconds:.2f} | {tokens / seconds:.0f} | {base / seconds:.2f}x |")


if __name__ == "__main__":
    main()
