"""A persistent judgement cache in sqlite, keyed by a hash of the judge model and the exact prompt.

It survives restarts, so re-scoring a run or resuming training pays for each judgement once.
Only parsed judgements are stored; fallbacks are never cached (the judge may be back next time).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any


def cache_key(kind: str, model: str, messages: list[dict[str, str]], settings: dict | None = None) -> str:
    """Hash of everything that determines a judgement: kind, judge model, prompt and judge settings."""
    payload = json.dumps([kind, model, messages, settings or {}], ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class JudgementCache:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS judgements (key TEXT PRIMARY KEY, kind TEXT, model TEXT, "
            "score REAL, analysis TEXT, created REAL DEFAULT (julianday('now')))"
        )
        self._db.commit()

    def get(self, key: str) -> tuple[float, str] | None:
        with self._lock:
            row = self._db.execute("SELECT score, analysis FROM judgements WHERE key = ?", (key,)).fetchone()
        return None if row is None else (float(row[0]), row[1])

    def put(self, key: str, kind: str, model: str, score: float, analysis: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO judgements (key, kind, model, score, analysis) VALUES (?, ?, ?, ?, ?)",
                (key, kind, model, score, analysis),
            )
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM judgements").fetchone()[0])

    def stats(self) -> dict[str, Any]:
        return {"path": str(self.path), "entries": len(self)}

    def close(self) -> None:
        with self._lock:
            self._db.close()
