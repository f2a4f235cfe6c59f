"""The fork server every worker of a run is forked from, with the heavy imports done.

Importing onnxruntime, onnx and the quantizers costs every spawned worker its first second; a
fork server imports them once, from a process holding no run state, so a forked worker starts
as clean as a spawned one. Not POSIX, or ``QUANTUNE_FORKSERVER=0``: workers are spawned. This
module imports nothing of quantune so it can start before the engine is imported.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from collections.abc import Mapping
from multiprocessing.context import BaseContext
from typing import Any

# Imported once in the fork server (what a worker needs first: see engine/measure/_preload.py).
PRELOAD = ["quantune.engine.measure._preload"]


EXIT_UNGUARDED_MAIN = 89  # a worker's exit code: the user's script reached tune() while the worker imported it
_UNAVAILABLE: list[str] = []  # why the fork server could not start in this process, if it could not


def uses_fork_server() -> bool:
    if _UNAVAILABLE or "forkserver" not in mp.get_all_start_methods():
        return False
    return os.environ.get("QUANTUNE_FORKSERVER", "1").strip().lower() not in ("0", "false", "no", "off")


def worker_context() -> BaseContext:
    """The context workers start from: the fork server (preloaded), else spawn."""
    if uses_fork_server():
        context = mp.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        return context
    return mp.get_context("spawn")


def will_fork(config: Any, executor: str | None = None, overrides: Mapping[str, Any] | None = None) -> bool:
    """Whether a run of ``config`` forks its workers, read before validation so the fork server starts
    early. A hint only: a config it cannot read says yes, and validation then says what is wrong."""
    if executor is not None:
        return executor == "process"
    if overrides and "executor.kind" in overrides:
        return overrides["executor.kind"] == "process"
    try:
        if isinstance(config, (str, os.PathLike)):
            import yaml

            with open(config, encoding="utf-8") as handle:
                config = yaml.safe_load(handle)
        if isinstance(config, Mapping):
            return (config.get("executor") or {}).get("kind", "process") == "process"
        return getattr(config, "config", config).executor.kind == "process"
    except Exception:
        return True


def warm_up() -> None:
    """Starts the fork server now (a no-op when it runs already or workers are spawned)."""
    if not uses_fork_server():
        return
    worker_context()
    from multiprocessing import forkserver

    try:
        forkserver.ensure_running()
    except Exception as exc:  # e.g. no Unix sockets here: spawned workers, as before the fork server
        _UNAVAILABLE.append(f"{type(exc).__name__}: {exc}")


def refuse_in_starting_worker() -> None:
    """Stops a worker that, while importing the user's script, reached ``quantune.tune()``: an
    unguarded call would start a second run inside the worker and hang both."""
    if getattr(mp.current_process(), "_inheriting", False):
        # at once: the fork server would turn a SystemExit into exit code 1, losing the advice
        sys.stderr.flush()
        os._exit(EXIT_UNGUARDED_MAIN)
