"""RL's questions: dataset rows the cold start did not ask.

R3-RAG trains RL on 8,192 HotpotQA training questions "not used in the cold start": RL then pays for what the
policy does on questions SFT never showed it the answer to. The rows keep every field, and gain ``label``: the
question, its answers and its ``metadata`` (gold passage ids among them) in one object, since OpenRLHF hands the
agent one field of a row (``LABEL_KEY=label``) and schemes such as ``r3_gold`` need both the answers and the gold
passages. The sample is seeded; a rerun with the same settings writes nothing new, and other settings are refused.

    r3rag coldstart rl-data --data data/hotpotqa/train.jsonl --exclude runs/coldstart/samples.jsonl \\
        --per_dataset 8192 --out data/rl.jsonl
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from r3_env.data import iter_jsonl, write_jsonl
from r3_env.runs import Question, dataset_paths, load_questions

logger = logging.getLogger(__name__)


@dataclass
class RLDataConfig:
    data: str = field(default="", metadata={"help": "FlashRAG dataset files, comma-separated (DATASET/split.jsonl)"})
    exclude: str = field(
        default="",
        metadata={"help": "the cold start's samples.jsonl (or trajectories.jsonl), comma-separated: left out"},
    )
    per_dataset: int = field(default=0, metadata={"help": "questions per dataset, a seeded sample (0: all left)"})
    seed: int = field(default=0, metadata={"help": "the sample's seed"})
    out: str = field(default="", metadata={"help": "the RL questions' .jsonl (PROMPT_DATA of the launch scripts)"})

    def __post_init__(self) -> None:
        if not self.data:
            raise ValueError("data is required: the FlashRAG dataset files RL's questions come from")
        if not self.out:
            raise ValueError("out is required: the .jsonl to write (launch/ppo_r3.sh reads it as PROMPT_DATA)")
        if self.per_dataset < 0:
            raise ValueError(f"per_dataset must be 0 (every question left) or more, got {self.per_dataset}")


def asked_questions(paths: list[Path]) -> set[str]:
    """The ``DATASET/QUESTION_ID`` keys of the questions a cold start's samples or trajectories asked."""
    asked = set()
    for path in paths:
        for number, row in iter_jsonl(path):
            if not isinstance(row.get("dataset"), str) or "question_id" not in row:
                raise ValueError(
                    f"exclude: {path} line {number} has no dataset and question_id: give the samples.jsonl or "
                    "trajectories.jsonl that r3rag coldstart synth wrote"
                )
            asked.add(f"{row['dataset']}/{row['question_id']}")
    return asked


def labelled(question: Question) -> dict[str, Any]:
    """The row with ``label``: what r3rag's agent reads (:func:`r3_env.data.read_label`) from one field."""
    item = question.item
    if "label" in item.extra:
        raise ValueError(f"data: {question.key} has a field 'label' already; rl-data writes its own there")
    label = {**item.metadata, "question": item.question, "golden_answers": list(item.golden_answers)}  # the row's own
    return {**item.to_json(), "label": label}


def build_rl_data(config: RLDataConfig) -> dict[str, dict[str, int]]:
    """Write the RL questions; returns per dataset: its rows, those the cold start asked, those written, and how
    many of those name their gold passages."""
    asked = asked_questions(dataset_paths(config.exclude))
    chosen: list[Question] = []
    stats: dict[str, dict[str, int]] = {}
    by_dataset: dict[str, list[Question]] = {}
    for question in load_questions(dataset_paths(config.data)):
        by_dataset.setdefault(question.dataset, []).append(question)
    for dataset, questions in by_dataset.items():
        unasked = left = [question for question in questions if question.key not in asked]
        if config.per_dataset and config.per_dataset < len(unasked):
            picked = set(random.Random(f"{config.seed}/{dataset}").sample(range(len(unasked)), config.per_dataset))
            left = [question for i, question in enumerate(unasked) if i in picked]  # in the file's order
        chosen += left
        with_gold = sum(bool(question.item.metadata.get("supporting_passage_ids")) for question in left)
        stats[dataset] = {"rows": len(questions), "asked": len(questions) - len(unasked), "written": len(left),
                          "with_gold": with_gold}  # fmt: skip
        if left and not with_gold:
            logger.warning(
                "%s: none of its rows names gold passages (metadata.supporting_passage_ids): schemes that read them "
                "(r3_gold, gold_hit) give its episodes a neutral reward",
                dataset,
            )
        if asked and not stats[dataset]["asked"]:
            logger.warning(
                "%s: none of its questions is among the excluded ones: a cold start names a dataset by its folder "
                "(DATASET/split.jsonl), so give the files it was given",
                dataset,
            )
    if not chosen:
        raise ValueError(f"exclude: the cold start asked every question of {config.data}: none is left for RL")
    rows = [labelled(question) for question in chosen]
    out = Path(config.out)
    if out.is_dir():
        raise ValueError(f"out: {out} is a folder; give the .jsonl file to write")
    if out.exists():  # nothing written is lost: the same settings find the file written, others are refused
        if [row for _, row in iter_jsonl(out)] == rows:
            logger.info("%s already holds these %d questions", out, len(rows))
            return stats
        raise FileExistsError(f"out: {out} holds other questions; remove it or give another --out")
    write_jsonl(out, rows, desc="RL questions")
    return stats


def format_stats(stats: dict[str, dict[str, Any]], out: str) -> str:
    lines = [f"{'dataset':<20}{'rows':>8}{'asked':>8}{'written':>9}{'with gold':>11}"]
    lines += [f"{name:<20}{row['rows']:>8}{row['asked']:>8}{row['written']:>9}{row['with_gold']:>11}"
              for name, row in stats.items()]  # fmt: skip
    total = sum(row["written"] for row in stats.values())
    lines.append(
        f"{total} RL questions in {out} (launch/ppo_r3.sh: PROMPT_DATA={out}, and LABEL_KEY=label for schemes "
        "that read the gold passages)"
    )
    return "\n".join(lines)
