"""How much of an SFT step's CPU time the kernel takes under glibc's default malloc, and under r3rag's tuning.

    python bench/cpu_malloc.py [--policy smollm2-135m-instruct] [--tokens 750] [--micro_batch 2] [--repeats 2]
        [--variants "LoRA rank 16,last 8 layers"]

``r3rag`` and the training benches start themselves again with glibc's mmap and trim thresholds raised
(``r3_env/allocator.py``), so that PyTorch's large CPU buffers stay in the heap between steps instead of
being unmapped on free and zeroed by the kernel on the next step. This bench times bench/sft_speed.py's
forward-and-backward pass of each variant in two fresh processes, one with glibc's defaults
(``R3RAG_SYSTEM_MALLOC=1``, no ``GLIBC_TUNABLES``) and one with the tuning, and prints seconds per
micro-batch (the fastest timed pass), the share of each process's CPU time spent in the kernel, and the
speed-up. The processes run one after another; run the bench alone, since two torch jobs on two cores
slow each other several times over.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sft_speed import add_step_arguments, time_step, variants  # noqa: E402

from r3_env.allocator import OPT_OUT, TUNABLES  # noqa: E402

logger = logging.getLogger("cpu_malloc")
MALLOCS = {"glibc defaults": {OPT_OUT: "1"}, "r3rag's tuning": {"GLIBC_TUNABLES": TUNABLES}}


def child(args: argparse.Namespace) -> None:
    """One variant in this process: its fastest pass and the process's user and kernel CPU seconds, as JSON."""
    settings = variants(args.layers)[args.child]
    seconds = time_step(args.policy, settings, args.tokens, args.micro_batch, args.repeats)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"seconds": seconds, "user_s": usage.ru_utime, "kernel_s": usage.ru_stime}))


def kernel_share(run: dict[str, float]) -> float:
    """The share of a measured process's CPU time spent in the kernel."""
    return run["kernel_s"] / (run["user_s"] + run["kernel_s"])


def measure(args: argparse.Namespace, policy: str, variant: str, malloc: dict[str, str]) -> dict[str, float]:
    environ = {key: value for key, value in os.environ.items() if key not in ("GLIBC_TUNABLES", OPT_OUT)}
    command = [sys.executable, __file__, "--child", variant, "--policy", policy, "--tokens", str(args.tokens),
               "--micro_batch", str(args.micro_batch), "--layers", str(args.layers),
               "--repeats", str(args.repeats)]  # fmt: skip
    done = subprocess.run(command, env=environ | malloc, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"{variant} ({malloc}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(parser, layers=8, repeats=2)
    parser.add_argument(
        "--variants",
        default="LoRA rank 16,last {layers} layers",
        help="comma-separated bench/sft_speed.py variants ({layers}: --layers); the bf16 ones only where the CPU has "
        "native bf16 (AVX512-BF16 or AMX): elsewhere autocast emulates it, slower than fp32",
    )
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)  # one measurement, in a fresh process
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    names = [name.strip().format(layers=args.layers) for name in args.variants.split(",") if name.strip()]
    if unknown := [name for name in names if name not in variants(args.layers)]:
        sys.exit(f"--variants: {', '.join(unknown)}; choose from {', '.join(variants(args.layers))}")
    from r3_env.model_registry import MODELS, get_model

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        policy = args.policy
        if policy in MODELS:
            policy = str(get_model(policy, Path(scratch) / "policy"))
        for variant in names:
            runs = {}
            for label, malloc in MALLOCS.items():
                run = runs[label] = measure(args, policy, variant, malloc)
                logger.info("%s, %s: %.2f s per micro-batch, %.0f%% of CPU time in the kernel", variant, label,
                            run["seconds"], 100 * kernel_share(run))  # fmt: skip
            rows.append((variant, runs))
    print(f"| variant ({args.policy}, {args.micro_batch} x {args.tokens} tokens) | malloc | s per micro-batch | "
          "kernel share of CPU time | speed-up |")  # fmt: skip
    print("|---|---|---|---|---|")
    for variant, runs in rows:
        base = runs["glibc defaults"]["seconds"]
        for label, run in runs.items():
            print(f"| {variant} | {label} | {run['seconds']:.2f} | {100 * kernel_share(run):.0f}% | "
                  f"{base / run['seconds']:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
