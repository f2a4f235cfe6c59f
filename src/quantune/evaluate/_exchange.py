"""What quantune's side keeps to talk to evaluation servers (``target_server.py``): one server
per interpreter and role in a process, a private folder for the arrays and requests exchanged
with them, and the memory probe both backends share."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from quantune.evaluate.feeds import FeedOutputs
from quantune.evaluate.target_client import TargetClient
from quantune.evaluate.target_server import load_arrays

Feeds = list[dict[str, np.ndarray]]

_ROOT_ENV = "QUANTUNE_SCRATCH_ROOT"


def scratch_root() -> Path:
    """One scratch folder for this process and its workers, removed at exit (a killed worker cleans nothing)."""
    root = os.environ.get(_ROOT_ENV)
    if root and Path(root).is_dir():
        return Path(root)
    made = Path(tempfile.mkdtemp(prefix="quantune-scratch-"))
    os.environ[_ROOT_ENV] = str(made)
    atexit.register(shutil.rmtree, str(made), True)
    return made


_SHARED: dict[tuple[str, str, int | None], TargetClient] = {}


def shared_client(python: str, role: str, *, timeout_s: float, memory_limit_mb: int | None) -> TargetClient:
    """One server per interpreter, role and limit in this process, so idle servers do not pile up."""
    key = (python, role, memory_limit_mb)
    client = _SHARED.get(key)
    if client is None:
        log_dir = Path(tempfile.mkdtemp(prefix="target-log-", dir=scratch_root()))
        client = TargetClient(python, log_dir / f"{role}.log", timeout_s=timeout_s, memory_limit_mb=memory_limit_mb)
        _SHARED[key] = client
        atexit.register(client.stop)
        atexit.register(shutil.rmtree, log_dir, True)
    client.timeout_s = timeout_s
    return client


class Scratch:
    """A private folder for arrays and requests exchanged with server processes, removed at exit."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="target-", dir=scratch_root()))
        self._written: dict[int, tuple[object, Path, list[list[str]]]] = {}  # the evaluation and latency feeds
        self._count = 0
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.dir), True)  # at exit, or when dropped

    def path(self, suffix: str) -> Path:
        self._count += 1
        return self.dir / f"{self._count}{suffix}"

    def arrays(self, feeds: Feeds) -> tuple[Path, list[list[str]]]:
        """``feeds`` written once as ``.npz`` (kept while the same list object is asked for again)."""
        known = self._written.get(id(feeds))
        if known is not None and known[0] is feeds:
            return known[1], known[2]
        if len(self._written) >= 4:  # not the run's feeds: forget them (and their file)
            for _, (_, stale, _) in self._written.items():
                stale.unlink(missing_ok=True)
            self._written.clear()
        path = self.path(".npz")
        layout = [[str(name) for name in feed] for feed in feeds]
        arrays = [np.ascontiguousarray(value) for feed in feeds for value in feed.values()]
        np.savez(path, **{f"a{index}": value for index, value in enumerate(arrays)})
        self._written[id(feeds)] = (feeds, path, layout)
        return path, layout

    def close(self) -> None:
        self._finalizer()


def read_outputs(path: Path, layout: list[list[str]]) -> FeedOutputs:
    """Arrays a server wrote, back into one dict per feed (the server's own reader: one format)."""
    return load_arrays(np, path, layout)


class MemoryProbe:
    """Peak memory of a fresh session, measured by the server script's one-shot mode."""

    def __init__(
        self,
        client: TargetClient,
        scratch: Scratch,
        provider: str,
        options: Mapping[str, Any],
        runner: str | None = None,
    ) -> None:
        self.client, self.scratch = client, scratch
        self.provider, self.provider_options = provider, dict(options)
        self.runner = runner  # "/abs/script.py:function": the model is driven as the evaluation runner drives it

    def measure(self, model: Path, feed: dict[str, np.ndarray], threads: int, settings: Mapping | None) -> float:
        path, layout = self.scratch.arrays([feed])
        request = {
            "model": str(model),
            "feed": str(path),
            "names": layout[0],
            "threads": threads,
            "provider": self.provider,
            "provider_options": self.provider_options,
            "settings": dict(settings or {}),
            "runner": self.runner,
        }
        if os.name == "posix":  # forked from a server that stays up: no interpreter start per measurement
            answer = self.client.request("memory", **request)
        else:
            request_path = self.scratch.path(".json")
            request_path.write_text(json.dumps(request))
            try:
                answer = self.client.one_shot(request_path)
            finally:
                request_path.unlink(missing_ok=True)
        return round(float(answer["peak_memory_mb"]), 2)
