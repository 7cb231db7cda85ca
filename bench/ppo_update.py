"""What one PPO actor update costs on CPU, measured in one run: with the entropy logged or in the loss, or
with fewer layers trained and no reference model.

    python bench/ppo_update.py [--compare entropy|training] [--policy smollm2-135m-instruct] [--tokens 1000]
                               [--actions 800] [--episodes 4] [--micro_batch 2] [--mixed_precision bf16]
                               [--layers 8] [--repeats 2]

Runs the local trainer's own update (``PPOUpdates.actor_step``: OpenRLHF's Actor, PolicyLoss and
compute_entropy, then one AdamW step) on ``--episodes`` random transcripts of ``--tokens`` tokens whose
last ``--actions`` span the policy's steps (the cold-start transcripts average about 750 SmolLM2 tokens
and reach about 1,200, so 1,000 is the long end, where the peak is set), in micro-batches of ``--micro_batch``.
Before it, the experience pass ``PPOTrainer.make_experiences`` makes for the same transcripts
(``PPOTrainer.score``): the actor's log-probs without a graph, and the reference model's where there is
one. Each variant runs in its own process, so its peak resident memory (``getrusage``, what PPO logs as
``peak_rss_gib``) is its own.

``--compare entropy`` (under ``--mixed_precision``, the SmolLM2 recipe's bf16 autocast by default):

- ``entropy_coef 0``: the default, the entropy is logged and computed without a graph;
- ``entropy_coef 0.01``: the entropy bonus is in the loss, so backward runs through a softmax over the
  vocabulary at every action position.

``--compare training``: what an iteration's model work costs per episode, which sets how many episodes an
RL arm gets for its wall time:

- all layers, the reference model, bf16 autocast (the rl_gain benches' settings until 2026-11);
- all layers, the reference model, fp32;
- the last ``--layers`` layers (``model.trainable_layers``), the reference model, fp32: backward stops there;
- the same without the reference model (``ppo.init_kl_coef 0``): no KL penalty, one forward pass fewer;
- the same under bf16 autocast.

Prints seconds per update (the fastest of ``--repeats`` after one warm-up), split into the experience
pass and the update, and peak memory, and the ratios to the first row. Run it alone: two torch jobs on
two cores slow each other several times over.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

logger = logging.getLogger("ppo_update")


@dataclass(frozen=True)
class Variant:
    """One way to run the update: the settings the comparison varies."""

    name: str
    entropy_coef: float = 0.0
    mixed_precision: str = "bf16"
    trainable_layers: int = 0  # 0: all
    reference: bool = True  # ppo.init_kl_coef 0.01 (the default) or 0


def variants(args: argparse.Namespace) -> list[Variant]:
    if args.compare == "entropy":
        return [
            Variant("entropy_coef 0 (logged)", 0.0, args.mixed_precision),
            Variant("entropy_coef 0.01 (in the loss)", 0.01, args.mixed_precision),
        ]
    last = f"last {args.layers} layer{'s' if args.layers > 1 else ''}"
    return [
        Variant("all layers, reference, bf16 autocast", mixed_precision="bf16"),
        Variant("all layers, reference, fp32", mixed_precision="no"),
        Variant(f"{last}, reference, fp32", mixed_precision="no", trainable_layers=args.layers),
        Variant(f"{last}, no reference, fp32", mixed_precision="no", trainable_layers=args.layers, reference=False),
        Variant(f"{last}, no reference, bf16 autocast", trainable_layers=args.layers, reference=False),
    ]


def time_update(policy: str, variant: Variant, args: argparse.Namespace, out: str) -> tuple[float, float, float]:
    """(the fastest experience pass's seconds, the fastest update's, the process's peak resident GiB)."""
    import torch

    from r3_env.rollout_config import RolloutConfig
    from r3_env.train.config import ModelConfig, PPOConfig, RunConfig
    from r3_env.train.ppo import PPOTrainer

    torch.manual_seed(0)
    ppo = PPOConfig(
        estimator="reinforce",
        entropy_coef=variant.entropy_coef,
        train_batch_size=args.episodes,
        micro_batch_size=args.micro_batch,
        max_len=args.tokens,
        init_kl_coef=0.01 if variant.reference else 0.0,
    )
    run = RunConfig(out=out, seed=0, device="cpu")
    model = ModelConfig(
        policy=policy, mixed_precision=variant.mixed_precision, trainable_layers=variant.trainable_layers
    )
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
        experience_times, update_times = [], []
        for _ in range(args.repeats + 1):
            started = time.perf_counter()
            for batch in group:  # make_experiences' model work: the log-probs the update's ratio starts from
                trainer.score(batch)
            experience_times.append(time.perf_counter() - started)
            started = time.perf_counter()
            trainer.updates.actor_step(group)
            update_times.append(time.perf_counter() - started)
    finally:
        trainer.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return min(experience_times[1:]), min(update_times[1:]), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", choices=("entropy", "training"), default="entropy", help="which variants")
    parser.add_argument("--policy", default="smollm2-135m-instruct", help="a registry model or an HF model folder")
    parser.add_argument("--tokens", type=int, default=1000, help="tokens per transcript")
    parser.add_argument("--actions", type=int, default=800, help="tokens from the policy's first step to the end")
    parser.add_argument("--episodes", type=int, default=4, help="transcripts per update (one optimizer step)")
    parser.add_argument("--micro_batch", type=int, default=2, help="transcripts per forward pass")
    parser.add_argument(
        "--mixed_precision", default="bf16", choices=("bf16", "no"), help="--compare entropy: model.mixed_precision"
    )
    parser.add_argument("--layers", type=int, default=8, help="--compare training: the last layers that train")
    parser.add_argument("--repeats", type=int, default=2, help="timed updates per variant (the fastest counts)")
    args = parser.parse_args()
    if args.repeats < 1 or args.episodes < 1 or args.layers < 1:
        parser.error(
            f"--repeats, --episodes and --layers must be at least 1, got {args.repeats}, {args.episodes} and "
            f"{args.layers}"
        )
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
        for number, variant in enumerate(variants(args)):
            with spawn.Pool(1) as pool:
                results[variant.name] = pool.apply(time_update, (policy, variant, args, f"{scratch}/run{number}"))
            seconds = results[variant.name]
            logger.info("%s: experience pass %.2f s, update %.2f s, peak %.2f GiB", variant.name, *seconds)
    base_experience, base_update, base_gib = next(iter(results.values()))
    precision = f", {args.mixed_precision}" if args.compare == "entropy" else ""
    shape = (
        f"{args.policy}, {args.episodes} x {args.tokens} tokens ({args.actions} actions), "
        f"micro-batch {args.micro_batch}{precision}"
    )
    columns = "s, experience pass | s per update | s in all | peak GiB | time vs first | memory vs first"
    print(f"| variant ({shape}) | {columns} |")
    print("|---|---|---|---|---|---|---|")
    for name, (experience, update, gib) in results.items():
        total = experience + update
        print(
            f"| {name} | {experience:.2f} | {update:.2f} | {total:.2f} | {gib:.2f} | "
            f"{total / (base_experience + base_update):.2f}x | {gib / base_gib:.2f}x |"
        )


if __name__ == "__main__":
    main()
