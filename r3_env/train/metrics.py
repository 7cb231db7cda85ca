"""Training metrics: one JSON line per logged step in ``metrics.jsonl``, the same scalars in TensorBoard.

The file is append-only. A resumed run logs again the steps after its last checkpoint, so
readers keep the last line of each ``(stage, step)``: :func:`read_metrics` does.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from r3_env.data import JsonlWriter

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


class MetricsLog:
    def __init__(self, out: Path, tensorboard: bool = True) -> None:
        self.path = Path(out) / METRICS_FILE
        self._rows = JsonlWriter(self.path)
        self._board = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._board = SummaryWriter(str(Path(out) / "tensorboard"))

    def log(self, stage: str, step: int, values: dict[str, float]) -> None:
        self._rows.write({"stage": stage, "step": step, "time": round(time.time(), 3), **values})
        if self._board is not None:
            for key, value in values.items():
                self._board.add_scalar(f"{stage}/{key}", value, step)
            self._board.flush()

    def close(self) -> None:
        self._rows.close()
        if self._board is not None:
            self._board.close()


def read_latest_rows(path: Path, file_name: str, key: Callable[[dict[str, Any]], Any]) -> list[dict[str, Any]]:
    """An append-only JSONL log's rows sorted by ``key``, the last line of each key winning (a resumed run's).

    ``path`` is the file, or the folder holding ``file_name``; a missing file has no rows.
    """
    path = Path(path)
    if path.is_dir():
        path = path / file_name
    latest: dict[Any, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except ValueError:  # a line cut by a killed run
                continue
            latest[key(row)] = row
    return [latest[k] for k in sorted(latest)]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The logged rows in step order per stage, the last line of each ``(stage, step)`` winning."""
    return read_latest_rows(path, METRICS_FILE, lambda row: (row["stage"], row["step"]))
