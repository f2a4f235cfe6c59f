"""The run's own record: an SQLite database in the output folder, one row per finished trial.

Written as each trial finishes (WAL mode), so a crash loses at most the trials in flight; a full
disk raises :class:`~quantune.errors.DiskFull` and SQLite rolls the transaction back.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from quantune.store.faults import storage_errors
from quantune.store.lock import RunLock

_SCHEMA = """
CREATE TABLE IF NOT EXISTS run (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trials (
    number INTEGER PRIMARY KEY,
    flow TEXT NOT NULL,
    params TEXT NOT NULL,
    status TEXT NOT NULL,
    record TEXT NOT NULL,
    finished_at REAL NOT NULL
);
"""


class RunStore:
    """Trials of one run, keyed by trial number; each row holds the full trial record as JSON."""

    def __init__(self, path: str | Path, *, lock: RunLock | None = None) -> None:
        """``lock``: the output folder's run lock, released by :meth:`close`."""
        self.path = Path(path)
        self.lock = lock
        with storage_errors(self.path, "--output"):
            self._conn = sqlite3.connect(self.path)
            self._conn.execute("PRAGMA journal_mode=WAL")
            # In WAL mode NORMAL still loses nothing committed when the process is killed.
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(_SCHEMA)

    def set_meta(self, key: str, value: Any) -> None:
        with storage_errors(self.path, "--output"), self._conn:
            self._conn.execute(
                "INSERT OR REPLACE INTO run (key, value) VALUES (?, ?)", (key, json.dumps(value, default=str))
            )

    def get_meta(self, key: str) -> Any:
        row = self._conn.execute("SELECT value FROM run WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def record_trial(self, record: dict[str, Any]) -> None:
        with storage_errors(self.path, "--output"), self._conn:
            self._conn.execute(
                "INSERT OR REPLACE INTO trials (number, flow, params, status, record, finished_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    record["number"],
                    json.dumps(record["flow"]),
                    json.dumps(record["params"], sort_keys=True, default=str),
                    record["status"],
                    json.dumps(record, default=str),
                    time.time(),
                ),
            )

    def trials(self) -> list[dict[str, Any]]:
        rows = self._conn.execute("SELECT record FROM trials ORDER BY number").fetchall()
        return [json.loads(row[0]) for row in rows]

    def clear(self) -> None:
        with storage_errors(self.path, "--output"), self._conn:
            self._conn.execute("DELETE FROM trials")
            self._conn.execute("DELETE FROM run")

    def close(self) -> None:
        self._conn.close()
        if self.lock is not None:
            self.lock.release()
