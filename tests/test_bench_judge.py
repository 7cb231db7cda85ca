"""bench/judge_quality.py: the AUC it reports, and an end-to-end run with the lexical judge on real questions."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, SHARED_DATA, shared_dataset

sys.path.insert(0, str(ROOT / "bench"))

from judge_quality import auc


def test_auc_counts_pairs_ranked_right_and_ties_as_half():
    assert auc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert auc([0.1], [0.9]) == 0.0
    assert auc([0.5, 0.5], [0.5, 0.5]) == 0.5
    assert auc([0.9, 0.3], [0.5]) == 0.5
    with pytest.raises(ValueError, match="at least one positive and one negative"):
        auc([], [0.1])


def test_the_bench_judges_gold_against_distractors_on_real_questions(tmp_path):
    shared_dataset("hotpotqa")
    command = [sys.executable, str(ROOT / "bench" / "judge_quality.py"), "--questions", "6", "--judges", "lexical"]
    command += ["--data", str(SHARED_DATA), "--work", str(tmp_path)]
    printed = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True).stdout
    assert "AUC bm25" in printed and "dataset" in printed and "lexical" in printed
    results = json.loads((tmp_path / "results.json").read_text())
    assert (results["skip"], results["questions"]) == (40, 6)  # the first 40 are the tuning sample: left out
    lexical = results["judges"]["lexical"]
    assert set(lexical["relevance_auc"]) == {"bm25", "dataset"}
    assert all(0 <= value <= 1 for value in lexical["relevance_auc"].values()) and lexical["relevance_parsed"] == 1.0
    assert lexical["correctness_accuracy"] == 1.0  # the golden answer itself, and another question's answer
