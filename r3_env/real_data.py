"""Several FlashRAG samples (each a dataset beside its own paragraph corpus) as one retrieval world.

The shared multi-hop samples (``../shared/data/{hotpotqa,2wikimultihopqa,musique}``) each ship
``dev.jsonl`` and ``corpus.jsonl``, and their passage ids collide ("0" is a passage of every
corpus). :func:`prepare_real_data` writes:

- ``corpus.jsonl``: the union of the corpora, every passage id prefixed with its dataset
  (``hotpotqa/0``), so one index serves every question, as Wikipedia does for the paper;
- ``DATASET/train.jsonl`` and ``DATASET/eval.jsonl``: each dataset's questions split by id, with
  the passage ids in their metadata (``supporting_passage_ids``, ``context_passage_ids``) prefixed
  the same way; the split is :func:`split_part`, a fixed hash of the question id, so it never
  depends on file order and a question keeps its side when a sample grows;
- ``prompts.jsonl``: every train question, the datasets interleaved (PPO's prompts).

``real_data.json`` records the source files' sizes and the settings; a rerun with the same ones
does nothing, and a rerun with others is refused.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r3_env.data import Passage, QAItem, iter_corpus, read_dataset, write_corpus, write_dataset

logger = logging.getLogger(__name__)

SPLIT_SALT = "r3rag-split-v1"
DATASETS = ("hotpotqa", "2wikimultihopqa", "musique")
# the shared samples beside a checkout (../shared/data), for tests and benches; $R3RAG_SHARED_DATA points elsewhere
SHARED_DATA = Path(os.environ.get("R3RAG_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
RECORD = "real_data.json"
PASSAGE_ID_KEYS = ("supporting_passage_ids", "context_passage_ids")


def split_part(question_id: str, eval_share: float = 0.5) -> str:
    """``"eval"`` or ``"train"``: the first 8 bytes of sha256("r3rag-split-v1:" + id) as a share of 2**64."""
    digest = hashlib.sha256(f"{SPLIT_SALT}:{question_id}".encode()).digest()
    return "eval" if int.from_bytes(digest[:8], "big") / 2**64 < eval_share else "train"


@dataclass(frozen=True)
class RealData:
    """Where :func:`prepare_real_data` put everything."""

    root: Path
    datasets: tuple[str, ...]

    @property
    def corpus(self) -> Path:
        return self.root / "corpus.jsonl"

    @property
    def prompts(self) -> Path:
        return self.root / "prompts.jsonl"

    def files(self, part: str) -> list[Path]:
        return [self.root / name / f"{part}.jsonl" for name in self.datasets]

    def data(self, part: str) -> str:
        """The part's files as a comma-separated ``data`` value (``r3rag eval run --data``, ``coldstart synth``)."""
        return ",".join(str(path) for path in self.files(part))


def _prefixed(item: QAItem, dataset: str) -> QAItem:
    """The item with every passage id its metadata names prefixed (lists of ids, and a decomposition's
    ``passage_id``; MuSiQue's ``paragraph_support_idx`` indexes ``context_passage_ids`` and stays)."""
    metadata = dict(item.metadata)
    for key in PASSAGE_ID_KEYS:
        if isinstance(metadata.get(key), list):
            metadata[key] = [f"{dataset}/{pid}" for pid in metadata[key]]
    if isinstance(metadata.get("question_decomposition"), list):
        metadata["question_decomposition"] = [
            {**hop, "passage_id": f"{dataset}/{hop['passage_id']}"} if isinstance(hop, dict) and "passage_id" in hop
            else hop
            for hop in metadata["question_decomposition"]
        ]  # fmt: skip
    return QAItem(item.id, item.question, item.golden_answers, metadata, item.extra)


def _interleave(groups: Sequence[list[QAItem]]) -> list[QAItem]:
    """One question of each dataset in turn, so the first PPO batches already mix them."""
    return [item for row in itertools.zip_longest(*groups) for item in row if item is not None]


def prepare_real_data(source: Path, out: Path, datasets: Sequence[str] = DATASETS, eval_share: float = 0.5) -> RealData:
    """Write the union corpus and the split (see the module's docstring); returns where they are."""
    if not 0 < eval_share < 1:
        raise ValueError(f"eval_share must lie strictly between 0 and 1, got {eval_share}")
    if not datasets:
        raise ValueError("datasets: name at least one dataset folder")
    missing = [
        str(source / name / file)
        for name in datasets
        for file in ("dev.jsonl", "corpus.jsonl")
        if not (source / name / file).is_file()
    ]
    if missing:
        raise FileNotFoundError(
            f"data: {source} lacks {', '.join(missing)}; it must hold one folder per dataset with dev.jsonl "
            "(FlashRAG questions) and corpus.jsonl (their paragraphs), as ../shared/data does"
        )
    settings: dict[str, Any] = {
        "source": str(source.resolve()),
        "datasets": list(datasets),
        "eval_share": eval_share,
        "split_salt": SPLIT_SALT,
        "sizes": {
            name: [(source / name / f).stat().st_size for f in ("dev.jsonl", "corpus.jsonl")] for name in datasets
        },
    }
    prepared = RealData(out, tuple(datasets))
    record = out / RECORD
    if record.is_file():
        previous = json.loads(record.read_text())
        if previous.get("settings") == settings:
            return prepared
        raise ValueError(
            f"{out} holds data prepared with other settings or from source files that changed since ({record}): "
            f"delete {out} to prepare it again (a demo's data is OUT/data), or choose another folder"
        )

    passages = (
        Passage(f"{name}/{passage.id}", passage.contents)
        for name in datasets
        for passage in iter_corpus(source / name / "corpus.jsonl")
    )
    documents = write_corpus(prepared.corpus, passages)
    counts: dict[str, dict[str, int]] = {}
    train_groups = []
    for name in datasets:
        items = [_prefixed(item, name) for item in read_dataset(source / name / "dev.jsonl")]
        parts = {
            part: [item for item in items if split_part(item.id, eval_share) == part] for part in ("train", "eval")
        }
        for part, chosen in parts.items():
            write_dataset(out / name / f"{part}.jsonl", chosen)
        counts[name] = {part: len(chosen) for part, chosen in parts.items()}
        train_groups.append(parts["train"])
    write_dataset(prepared.prompts, _interleave(train_groups))
    record.write_text(json.dumps({"settings": settings, "documents": documents, "questions": counts}, indent=2) + "\n")
    logger.info(
        "real data in %s: %d passages; %s",
        out,
        documents,
        ", ".join(f"{name} {c['train']} train / {c['eval']} eval" for name, c in counts.items()),
    )
    return prepared
