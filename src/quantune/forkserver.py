"""The fork server every worker of a run is forked from, with the heavy imports done.

A spawned worker starts a fresh interpreter and imports onnxruntime, onnx, numpy, the
quantizers and quantune before its first line of work: half a second to a second each on this
machine, for every stage worker and trial worker of a run (the original's evaluation, the first
guess, the ceiling builds, the sensitivity, the trial workers). A fork server imports them
once, in its own process, while the engine sets the run up on the other core; each worker is
then forked from it with those modules loaded. It forks from a process that holds no run state
(no sessions, no threads of the engine), so a worker starts as clean as a spawned one: the same preparation (``sys.path``, working folder, main module) and, passed by
its parent, the parent's environment as it is when the worker starts.

Where there is no fork server (not POSIX), or ``QUANTUNE_FORKSERVER=0``, workers are spawned.

It is started as soon as a run is known to use worker processes (``quantune run``, ``quantune.tune``,
the engine's set-up), which is why this module imports nothing of quantune: started from inside
``quantune.engine`` (whose package imports the engine itself, 0.2-0.4 s) it began importing that
much later, on the critical path of a small model's first answer.
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
    """Whether a run of ``config`` (a YAML/JSON path, a dict, a ``Config`` or ``LoadedConfig``) forks its
    workers (``executor.kind: process``, the default), read before the config is validated:
    a fork server started after the validation would be that much later ready for the original's
    evaluation. A hint only:
    a config it cannot read says yes, and the validation then says what is wrong."""
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
    """Starts the fork server now (it imports in its own process, beside the run's set-up); a
    no-op when it runs already or workers are spawned."""
    if not uses_fork_server():
        return
    worker_context()
    from multiprocessing import forkserver

    try:
        forkserver.ensure_running()
    except Exception as exc:  # e.g. no Unix sockets here: spawned workers, as before the fork server
        _UNAVAILABLE.append(f"{type(exc).__name__}: {exc}")


def refuse_in_starting_worker() -> None:
    """Stops a worker that, while importing the user's script, reached ``quantune.tune()``.

    Spawned workers import the main module first (so passes defined in a script exist in
    them too); a script that calls ``tune()`` unguarded would start a second run inside the
    worker and hang both. The worker exits with a code its parent turns into advice.
    """
    if getattr(mp.current_process(), "_inheriting", False):
        # at once, with the code: a worker forked by the fork server turns a SystemExit raised
        # while it prepares into exit code 1 (multiprocessing's forkserver), losing the advice
        sys.stderr.flush()
        os._exit(EXIT_UNGUARDED_MAIN)
