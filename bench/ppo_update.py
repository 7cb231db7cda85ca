"""What one PPO actor update costs on CPU, with the entropy only logged or in the loss, measured in one run.

    python bench/ppo_update.py [--policy smollm2-135m-instruct] [--tokens 1000] [--actions 800]
                               [--episodes 4] [--micro_batch 2] [--mixed_precision bf16] [--repeats 2]

Runs the local trainer's own update (``PPOTrainer._actor_step``: OpenRLHF's Actor, PolicyLoss and
compute_entropy, then one AdamW step) on ``--episodes`` random transcripts of ``--tokens`` tokens whose
last ``--actions`` span the policy's steps (the cold-start transcripts average about 750 SmolLM2 tokens
and reach about 1,200, so 1,000 is the long end, where the peak is set), in micro-batches of ``--micro_batch``, under
``--mixed_precision`` (the SmolLM2 recipe's: micro-batches of 2, bf16 autocast). Each variant runs in
its own process, so its peak resident memory (``getrusage``, what PPO logs as ``peak_rss_gib``) is its
own:

- ``entropy_coef 0``: the default, the entropy is logged and computed without a graph;
- ``entropy_coef 0.01``: the entropy bonus is in the loss, so backward runs through a softmax over the
  vocabulary at every action position.

Prints seconds per update (the fastest of ``--repeats`` after one warm-up) and peak memory, and the
ratios. Run it alone: two torch jobs on two cores slow each other several times over.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import resource
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

logger = logging.getLogger("ppo_update")

VARIANTS = {"entropy_coef 0 (logged)": 0.0, "entropy_coef 0.01 (in the loss)": 0.01}


def time_update(policy: str, entropy_coef: float, args: argparse.Namespace, out: str) -> tuple[float, float]:
    """(the fastest update's seconds, the process's peak resident GiB) for one entropy coefficient."""
    import torch

    from r3_env.rollout_config import RolloutConfig
    from r3_env.train.config import ModelConfig, PPOConfig, RunConfig
    from r3_env.train.ppo import PPOTrainer

    torch.manual_seed(0)
    ppo = PPOConfig(
        estimator="reinforce",
        entropy_coef=entropy_coef,
        train_batch_size=args.episodes,
        micro_batch_size=args.micro_batch,
        max_len=args.tokens,
    )
    run = RunConfig(out=out, seed=0, device="cpu")
    model = ModelConfig(policy=policy, mixed_precision=args.mixed_precision)
    trainer = PPOTrainer(run, model, ppo, RolloutConfig.from_dict({}), policy)
    try:
        vocab, size = trainer.actor.model.config.vocab_size, args.micro_batch
        group = []
        for _ in range(args.episodes // size):
            sequences = torch.randint(0, vocab, (size, args.tokens))
            group.append(
                SimpleNamespace(
                    sequences=sequences,
                    attention_mask=torch.ones_like(sequences),
                    action_mask=torch.ones(size, args.actions, dtype=torch.bool),
                    action_log_probs=torch.full((size, args.actions), -2.0),
                    advantages=torch.randn(size, args.actions),
                )
            )
        times = []
        for _ in range(args.repeats + 1):
            started = time.perf_counter()
            trainer._actor_step(group)
            times.append(time.perf_counter() - started)
    finally:
        trainer.close()
    return min(times[1:]), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="smollm2-135m-instruct", help="a registry model or an HF model folder")
    parser.add_argument("--tokens", type=int, default=1000, help="tokens per transcript")
    parser.add_argument("--actions", type=int, default=800, help="tokens from the policy's first step to the end")
    parser.add_argument("--episodes", type=int, default=4, help="transcripts per update (one optimizer step)")
    parser.add_argument("--micro_batch", type=int, default=2, help="transcripts per forward pass")
    parser.add_argument("--mixed_precision", default="bf16", help="model.mixed_precision: bf16 or no")
    parser.add_argument("--repeats", type=int, default=2, help="timed updates per variant (the fastest counts)")
    args = parser.parse_args()
    if args.repeats < 1 or args.episodes < 1:
        parser.error(f"--repeats and --episodes must be at least 1, got {args.repeats} and {args.episodes}")
    if args.micro_batch < 1 or args.episodes % args.micro_batch:
        parser.error(f"--episodes ({args.episodes}) must divide by --micro_batch ({args.micro_batch})")
    if not 0 < args.actions < args.tokens:
        parser.error(f"--actions must lie between 0 and --tokens ({args.tokens}), got {args.actions}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    from r3_env.model_registry import MODELS, get_model

    spawn = multiprocessing.get_context("spawn")  # a fresh process per variant: its own peak memory
    with tempfile.TemporaryDirectory() as scratch:
        policy = args.policy
        if policy in MODELS:
            policy = str(get_model(policy, Path(scratch) / "policy"))
        results = {}
        for number, (name, coef) in enumerate(VARIANTS.items()):
            with spawn.Pool(1) as pool:
                results[name] = pool.apply(time_update, (policy, coef, args, f"{scratch}/run{number}"))
            logger.info("%s: %.2f s per update, peak %.2f GiB", name, *results[name])
    base_s, base_gib = next(iter(results.values()))
    shape = (
        f"{args.policy}, {args.episodes} x {args.tokens} tokens ({args.actions} actions), "
        f"micro-batch {args.micro_batch}, {args.mixed_precision}"
    )
    print(f"| variant ({shape}) | s per update | peak GiB | time vs logged | memory vs logged |")
    print("|---|---|---|---|---|")
    for name, (seconds, gib) in results.items():
        print(f"| {name} | {seconds:.2f} | {gib:.2f} | {seconds / base_s:.2f}x | {gib / base_gib:.2f}x |")


if __name__ == "__main__":
    main()
