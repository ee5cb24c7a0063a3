"""Verdicts by the hash of everything that decides them (model, rubric, criteria, task, outputs):
a rerun, or a rescoring of the same outputs, asks the judge nothing."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from envhub.envs.cache import cache_dir

OFF = "off"


def default_path() -> Path:
    return cache_dir() / "judge.sqlite"


def cache_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, ensure_ascii=False).encode()
                          ).hexdigest()


class VerdictCache:
    """In memory, and in a SQLite file unless `path` is 'off' (None: `default_path()`).
    Safe across threads (groups are scored concurrently)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self._memory: dict[str, str] = {}
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if str(path) != OFF:
            file = Path(path).expanduser() if path is not None else default_path()
            file.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(file, check_same_thread=False, timeout=30)
            self._db.execute("CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, "
                             "content TEXT NOT NULL, created_at REAL NOT NULL)")
            self._db.commit()

    def get(self, key: str) -> str | None:
        with self._lock:
            if key in self._memory or self._db is None:
                return self._memory.get(key)
            row = self._db.execute("SELECT content FROM verdicts WHERE key = ?", (key,)).fetchone()
            if row is not None:
                self._memory[key] = row[0]
            return row[0] if row else None

    def put(self, key: str, content: str) -> None:
        with self._lock:
            self._memory[key] = content
            if self._db is not None:
                self._db.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?)",
                                 (key, content, time.time()))
                self._db.commit()
