"""The process context every worker of a run starts from: a fork server with the heavy imports done.

A spawned worker starts a fresh interpreter and imports onnxruntime, onnx, numpy, the
quantizers and quantune before its first line of work: half a second to a second each on this
machine, for every stage worker and trial worker of a run (the original's evaluation, the first
guess, the ceiling builds, the sensitivity, the trial workers), and the symbolic shape inference
that the extended pre-optimization needs imports sympy, another half second. A fork server
imports them once, in its own process, while the engine sets the run up on the other core;
each worker is then forked from it with those modules loaded. It forks from a process that
holds no run state (no sessions, no threads of the engine), so a worker starts as clean as a
spawned one: the same preparation (``sys.path``, working folder, main module) and, passed by
its parent, the parent's environment as it is when the worker starts.

Where there is no fork server (not POSIX), or ``QUANTUNE_FORKSERVER=0``, workers are spawned.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing.context import BaseContext

# Imported once in the fork server (what a worker needs first: see _preload.py).
PRELOAD = ["quantune.engine.executors._preload"]


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


def check_main_importable() -> None:
    """Workers import the script that started the run (so what it defines exists in them too);
    a script read from standard input or ``-c`` has no file to import, and every worker would
    die starting. Raises the error that says so, before any work."""
    import sys

    from quantune.errors import QuantuneError

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if getattr(getattr(main, "__spec__", None), "name", None) is None and path and not os.path.isfile(path):
        raise QuantuneError(
            f"executor: worker processes re-import the script that started the run, and '{path}' is no "
            "file (a script read from standard input): save it to a .py file and run that, or set "
            "executor.kind: inline"
        )


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


def child_environment() -> dict[str, str]:
    """The environment a worker must see: the parent's, now (the fork server's is its own, older)."""
    return dict(os.environ)


def adopt_environment(environment: dict[str, str] | None) -> None:
    """In the worker, first: the parent's environment replaces the fork server's."""
    if environment is None:
        return
    os.environ.clear()
    os.environ.update(environment)
