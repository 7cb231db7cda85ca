"""bench/ppo_update.py: the trainer's own experience pass and actor update, one process per variant, on a tiny random
policy. Slow (`pytest -m slow`): each variant is a process of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT, make_tokenizer, save_tiny_causal_lm

from r3_env.train.model_factory import CHATML_TEMPLATE

pytestmark = pytest.mark.slow


def bench(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "bench" / "ppo_update.py"), *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_bench_times_both_entropy_variants_and_refuses_a_bad_shape(tmp_path, bpe_backend):
    policy = save_tiny_causal_lm(tmp_path / "tiny", make_tokenizer(bpe_backend, CHATML_TEMPLATE))
    done = bench("--policy", str(policy), "--tokens", "48", "--actions", "16", "--repeats", "1")
    assert done.returncode == 0, done.stderr
    rows = table_rows(done.stdout)
    assert [cells[0] for cells in rows] == ["entropy_coef 0 (logged)", "entropy_coef 0.01 (in the loss)"]
    assert rows[0][5] == "1.00x" and all(float(cells[2]) > 0 for cells in rows)
    refused = bench("--policy", str(policy), "--episodes", "3")
    assert refused.returncode == 2 and "--episodes (3) must divide by --micro_batch (2)" in refused.stderr
    refused = bench("--policy", str(policy), "--repeats", "0")
    assert refused.returncode == 2 and "--repeats, --episodes and --layers must be at least 1, got 0, 4 and 8" in (
        refused.stderr
    )


def test_the_training_comparison_trains_fewer_layers_and_drops_the_reference(tmp_path, bpe_backend):
    policy = save_tiny_causal_lm(tmp_path / "tiny", make_tokenizer(bpe_backend, CHATML_TEMPLATE))
    small = ("--compare", "training", "--policy", str(policy), "--tokens", "48", "--actions", "16", "--repeats", "1")
    done = bench(*small, "--layers", "1")
    assert done.returncode == 0, done.stderr
    rows = table_rows(done.stdout)
    assert [cells[0] for cells in rows] == [
        "all layers, reference, bf16 autocast",
        "all layers, reference, fp32",
        "last 1 layer, reference, fp32",
        "last 1 layer, no reference, fp32",
        "last 1 layer, no reference, bf16 autocast",
    ]
    for cells in rows:
        experience, update, total = (float(cell) for cell in cells[1:4])
        # a tiny model's experience pass can print as 0.00 s; each cell is rounded to 0.01 s
        assert experience >= 0 and update > 0 and abs(experience + update - total) <= 0.0151
    refused = bench(*small, "--layers", "3")
    # the layer count reaches the trainer, which refuses more layers than the model has
    assert refused.returncode != 0 and "model.trainable_layers: 3 is more than the model's 2 layers" in refused.stderr


def table_rows(stdout: str) -> list[list[str]]:
    """The cells of the printed table's data rows (the header and the rule left out)."""
    lines = [line for line in stdout.splitlines() if line.startswith("| ") and not line.startswith("| variant")]
    return [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines]
