"""Score a FlashRAG output file with FlashRAG's own evaluator metrics and with r3rag's, side by side.

    .venv/bin/python bench/flashrag_parity.py RUN/intermediate_data.json [--dataset-name hotpotqa]

The file is what a FlashRAG pipeline saves (``dataset.save``): a JSON list of items with
``golden_answers`` and ``output.pred``. r3rag's ``predictions.jsonl`` (rows with ``prediction``)
is read too. Prints the means of EM, F1 and sub-EM ("acc" in FlashRAG) both ways and the number
of questions whose scores differ; exits 1 when any does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def read_items(path: Path) -> list[dict]:
    """(prediction, golden answers) rows of a FlashRAG output file or an r3rag predictions file."""
    text = path.read_text()
    if text.lstrip().startswith("["):
        return [{"pred": item.get("output", {}).get("pred", ""), "golden_answers": item["golden_answers"]}
                for item in json.loads(text)]  # fmt: skip
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [{"pred": row.get("prediction") or "", "golden_answers": row["golden_answers"]} for row in rows]


def compare(items: list[dict], dataset_name: str = "parity") -> dict[str, dict]:
    """Per metric: FlashRAG's mean, ours, and the questions whose scores differ."""
    from flashrag.dataset import Dataset, Item
    from flashrag.evaluator.metrics import ExactMatch, F1_Score, Sub_ExactMatch

    from eval.metrics import answer_scores

    config = {"dataset_name": dataset_name}
    data = Dataset(config=config, data=[Item({"golden_answers": i["golden_answers"], "output": {"pred": i["pred"]}})
                                        for i in items])  # fmt: skip
    ours = [answer_scores(i["pred"], i["golden_answers"]) for i in items]
    result = {}
    for name, metric in (("em", ExactMatch), ("f1", F1_Score), ("sub_em", Sub_ExactMatch)):
        theirs_mean, theirs = metric(config).calculate_metric(data)
        mine = [score[name] for score in ours]
        differ = [i for i, (a, b) in enumerate(zip(theirs, mine, strict=True)) if abs(float(a) - b) > 1e-9]
        result[name] = {"flashrag": float(next(iter(theirs_mean.values()))), "r3rag": sum(mine) / len(mine),
                        "differ": differ}  # fmt: skip
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--dataset-name", default="parity", help="FlashRAG's metrics use regex EM only for curatedtrec")
    args = parser.parse_args()
    items = read_items(args.file)
    result = compare(items, args.dataset_name)
    print(f"{len(items)} questions from {args.file}")
    print(f"{'metric':<8}{'FlashRAG':>10}{'r3rag':>10}{'differ':>8}")
    for name, row in result.items():
        print(f"{name:<8}{100 * row['flashrag']:>10.3f}{100 * row['r3rag']:>10.3f}{len(row['differ']):>8}")
    return 1 if any(row["differ"] for row in result.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
