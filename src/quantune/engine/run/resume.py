"""Resuming an interrupted run: finished trials are told again, not run again. The strategy is deterministic given the
same asks and tells, so they are replayed until a proposal differs; a trial whose model left the cache runs again."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from quantune.engine.trials.trial import TrialRecord
from quantune.space import point_key
from quantune.store import RunStore

log = logging.getLogger("quantune")

SKIP_LOG = "skipped_known_failures"  # run-store meta: [trials asked, trials told] at each skip, in order


class Replay:
    def __init__(self, stored: list[dict[str, Any]]) -> None:
        gone = [row["number"] for row in stored if not model_present(row)]
        if gone:  # said on the console too (the run takes longer, and its figures are measured anew)
            numbers = ", ".join(map(str, gone[:10])) + (", ..." if len(gone) > 10 else "")
            message = (
                f"{len(gone)} finished trial(s) run again: their models are no longer in the cache (trials {numbers})"
            )
            log.warning(message)
            print(f"quantune: warning: {message}", file=sys.stderr)
        self._stored = {row["number"]: row for row in stored if row["number"] not in gone}
        self._waiting: dict[int, TrialRecord] = {}  # asked again, not yet told again
        self.active = bool(self._stored)
        self.replayed = 0

    def __len__(self) -> int:
        return len(self._stored)

    def asked_after(self, number: int) -> float:
        """Tells due before trial ``number`` is asked; for a trial the store does not hold, every replayed tell."""
        row = self._stored.get(number)
        return float("inf") if row is None else int(row.get("asked_after", 0))

    def match(self, number: int, flow: list[str], params: dict[str, Any]) -> TrialRecord | None:
        """The stored record if trial ``number`` was asked with the same flow and params."""
        if not self.active:
            return None
        row = self._stored.get(number)
        if row is None:
            return None
        if row["flow"] != list(flow) or point_key(row["params"]) != point_key(params):
            self.active = False
            return None
        record = TrialRecord.from_dict(row)
        self._waiting[number] = record
        self.replayed += 1
        return record

    def next_tell(self) -> TrialRecord | None:
        """The waiting replayed record that was told first in the original run."""
        if not self._waiting:
            return None
        number = min(self._waiting, key=lambda n: self._stored[n].get("told_index", n))
        return self._waiting.pop(number)

    @property
    def waiting(self) -> int:
        return len(self._waiting)


def model_present(row: dict[str, Any]) -> bool:
    """Whether a stored trial's model is where its record says, with the recorded hash."""
    path = row.get("model_path")
    if row.get("status") != "ok" or not path:
        return True  # a failed trial has no model to lose
    model = Path(path)
    if not model.is_file():
        return False
    meta = model.parent / "meta.json"
    if not meta.is_file() or not row.get("model_sha256"):
        return True  # not a cache entry (the original, a prepared model): its file is there
    try:
        recorded = json.loads(meta.read_text()).get("sha256")
    except (OSError, ValueError, AttributeError):  # not a cache entry's record (a meta.json of the user's)
        return True
    return recorded is None or recorded == row["model_sha256"]


class SkipLog:
    """Proposals skipped as known failures: each a tell, logged where it came so a resumed run makes it then too."""

    def __init__(self, store: RunStore, *, resuming: bool) -> None:
        self.store = store
        self.events: list[list[int]] = list(store.get_meta(SKIP_LOG) or []) if resuming else []
        self.count = 0  # skips made by this run, replayed ones included

    def tells_before(self, asked: int, trial_tells: float) -> float:
        """Tells due before the next ask: the next logged skip's when it came first, else ``trial_tells``."""
        if self.count < len(self.events) and self.events[self.count][0] == asked:
            return self.events[self.count][1]
        return trial_tells

    def record(self, asked: int, told: int) -> None:
        event = [asked, told]
        if not (self.count < len(self.events) and self.events[self.count] == event):  # else: a replayed skip
            del self.events[self.count :]
            self.events.append(event)
            self.store.set_meta(SKIP_LOG, self.events)
        self.count += 1
