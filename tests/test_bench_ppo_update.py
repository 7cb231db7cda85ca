"""bench/ppo_update.py: the trainer's own actor update, one process per entropy variant, on a tiny random policy."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT, make_tokenizer, save_tiny_causal_lm

from r3_env.train.model_factory import CHATML_TEMPLATE


def bench(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "bench" / "ppo_update.py"), *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_bench_times_both_entropy_variants_and_refuses_a_bad_shape(tmp_path, bpe_backend):
    policy = save_tiny_causal_lm(tmp_path / "tiny", make_tokenizer(bpe_backend, CHATML_TEMPLATE))
    done = bench("--policy", str(policy), "--tokens", "48", "--actions", "16", "--repeats", "1")
    assert done.returncode == 0, done.stderr
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| entropy_coef")]
    assert [cells[0].strip() for cells in rows] == ["entropy_coef 0 (logged)", "entropy_coef 0.01 (in the loss)"]
    assert [cells[3].strip() for cells in rows][0] == "1.00x" and all(float(cells[2]) > 0 for cells in rows)
    refused = bench("--policy", str(policy), "--episodes", "3")
    assert refused.returncode == 2 and "--episodes (3) must divide by --micro_batch (2)" in refused.stderr
    refused = bench("--policy", str(policy), "--repeats", "0")
    assert refused.returncode == 2 and "--repeats and --episodes must be at least 1, got 0 and 4" in refused.stderr
