"""Teacher guidance on failure: the cold-start transcripts of the questions a PPO batch got wrong every time.

Small policies seldom sample a right episode on the questions they cannot yet do, so a group baseline gives
those questions no advantage and RL never learns them. DGPO (a distilled cold start, then RL guided by the
teacher only where the rollouts failed) trains on the teacher's episode exactly there. With
``ppo.ptx_select failed`` the PPO trainer looks up each such question's transcripts here, and the iteration's
actor steps add ``ptx_coef`` times their SFT loss to the policy loss, as PPO-ptx does; questions with a right
sample are left to the RL loss alone. The guidance shares the RL step rather than taking one of its own:
clipping to ``max_norm`` and AdamW both normalise a step's gradient, so ``ptx_coef`` on a step of its own
would hardly change the update.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from r3_env.train.sft import read_transcripts, transcript_dataset

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Transcripts:
    """Tokenized teacher transcripts and the ``SFTDataset`` that collates them."""

    dataset: Any
    items: list[Any] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.items)

    def share(self, number: int, parts: int) -> Transcripts:
        """Part ``number`` of ``parts``, taken in turn, so that ``parts`` actor steps train each transcript once."""
        return Transcripts(self.dataset, self.items[number::parts])


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

    def transcripts(self, question_ids: Iterable[str]) -> Transcripts:
        """These questions' transcripts, tokenized (none for questions without one)."""
        numbers = [number for question in question_ids for number in self.index.get(question, ())]
        if not numbers:
            return Transcripts(None)
        dataset = transcript_dataset(self.rows.select(numbers), self.tokenizer, self.max_len, self.chat_template)
        return Transcripts(dataset, [dataset[i] for i in range(len(dataset))])
