"""Teacher guidance on failure: the cold-start transcripts of the questions a PPO batch got wrong every time.

Small policies seldom sample a right episode on the questions they cannot yet do, so a group baseline gives
those questions no advantage and RL never learns them. DGPO (a distilled cold start, then RL guided by the
teacher only where the rollouts failed) trains on the teacher's episode exactly there. With
``ppo.ptx_select failed`` the PPO trainer looks up each such question's transcripts here and takes an SFT
step on them; questions with a right sample are left to the RL loss alone.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from r3_env.train.sft import read_transcripts, transcript_dataset

logger = logging.getLogger(__name__)


def question_key(row_id: str, dataset: str) -> str:
    """The question id a transcript row belongs to: ``r3rag coldstart`` writes ``<dataset>/<question id>``."""
    prefix = f"{dataset}/" if dataset else ""
    return row_id[len(prefix) :] if prefix and row_id.startswith(prefix) else row_id


class TranscriptsByQuestion:
    """A transcript-form file indexed by question id, tokenized on demand for the questions asked for."""

    def __init__(self, path: str, tokenizer: Any, max_len: int, chat_template: str | None, field: str) -> None:
        self.rows = read_transcripts(path, field)
        if "id" not in self.rows.column_names:
            raise ValueError(
                f"{field} {path} has no 'id' column, so its transcripts cannot be matched to the questions that "
                "failed: write it with r3rag coldstart sft-data, which keeps each trajectory's id"
            )
        self.tokenizer, self.max_len, self.chat_template = tokenizer, max_len, chat_template
        datasets = self.rows["dataset"] if "dataset" in self.rows.column_names else [""] * len(self.rows)
        self.index: dict[str, list[int]] = defaultdict(list)
        for number, (row_id, dataset) in enumerate(zip(self.rows["id"], datasets, strict=True)):
            self.index[question_key(str(row_id), dataset or "")].append(number)
        logger.info(
            "%s: %d transcripts of %d questions, for guidance on failure", field, len(self.rows), len(self.index)
        )

    def __contains__(self, question_id: str) -> bool:
        return question_id in self.index

    def transcripts(self, question_ids: Iterable[str]) -> tuple[Any, list[Any]]:
        """(the SFTDataset that collates them, its items) for these questions' transcripts; (None, []) for none."""
        numbers = [number for question in question_ids for number in self.index.get(question, ())]
        if not numbers:
            return None, []
        dataset = transcript_dataset(self.rows.select(numbers), self.tokenizer, self.max_len, self.chat_template)
        return dataset, [dataset[i] for i in range(len(dataset))]
