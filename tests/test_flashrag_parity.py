"""r3rag's EM / F1 / sub-EM equal FlashRAG's evaluator metrics, question by question.

FlashRAG's own metric classes (``flashrag.evaluator.metrics``) score the same file as
``bench/flashrag_parity.py`` does with ``eval.metrics``: first hand-made predictions that probe
normalisation's corners, then a FlashRAG output file (written by FlashRAG's ``Dataset.save``) of
real answers by SmolLM2-135M-Instruct to the shared HotpotQA sample. No published FlashRAG run
output with a licence that allows committing it was found, so the real-model file is made here.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from conftest import ROOT, shared_dataset

sys.path.insert(0, str(ROOT / "bench"))
from flashrag_parity import compare, read_items

CORNERS = [
    ("The Eiffel Tower.", ["Eiffel Tower"]),
    ("an apple a day", ["Apple"]),
    ("Paris, France", ["paris", "Paris, France"]),
    ("yes", ["Yes"]),
    ("no", ["not known"]),
    ("It was 1,200 people", ["1,200"]),
    ("Zürich", ["Zurich", "Zürich"]),
    ("", ["anything"]),
    ("J.R.R. Tolkien", ["J. R. R. Tolkien"]),
    ("noanswer", ["noanswer"]),
    ("the  the  Beatles", ["The Beatles"]),
    ("Queen Elizabeth II of the United Kingdom", ["Elizabeth II"]),
]


def test_hand_made_corners_score_alike():
    result = compare([{"pred": p, "golden_answers": g} for p, g in CORNERS])
    for name, row in result.items():
        assert row["differ"] == [], name
        assert row["flashrag"] == pytest.approx(row["r3rag"], abs=1e-12)
    assert 0 < result["em"]["r3rag"] < result["sub_em"]["r3rag"] < 1  # the corners are not all alike


@pytest.mark.slow
def test_a_real_models_flashrag_output_file_scores_alike(smollm2_model, tmp_path):
    from flashrag.dataset import Dataset, Item

    from eval.engines import EngineConfig, GenerationConfig
    from eval.run import EvalRunConfig, run_eval
    from r3_env.env import EnvConfig
    from r3_env.runs import RetrievalSource

    data = shared_dataset("hotpotqa") / "dev.jsonl"
    config = EvalRunConfig(data=str(data), out=str(tmp_path / "run"), method="direct", max_questions=40)
    engine = EngineConfig(model=str(smollm2_model), max_batch=40)
    stats = asyncio.run(run_eval(config, EnvConfig(max_step_tokens=48), engine, GenerationConfig(), RetrievalSource()))
    assert stats.done == 40
    rows = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    items = [Item({"id": r["question_id"], "question": r["question"], "golden_answers": r["golden_answers"],
                   "output": {"pred": r["prediction"]}}) for r in rows]  # fmt: skip
    path = tmp_path / "intermediate_data.json"
    Dataset(config={"dataset_name": "hotpotqa"}, data=items).save(str(path))  # FlashRAG's own output format
    assert len(read_items(path)) == 40 and any(item["pred"] for item in read_items(path))
    result = compare(read_items(path), "hotpotqa")
    assert all(row["differ"] == [] for row in result.values()), result
    assert result["f1"]["r3rag"] > 0  # real answers: some overlap with the gold ones
    printed = subprocess.run([sys.executable, str(ROOT / "bench" / "flashrag_parity.py"), str(path)],
                             capture_output=True, text=True)  # fmt: skip
    assert printed.returncode == 0 and "40 questions" in printed.stdout, printed.stdout + printed.stderr
