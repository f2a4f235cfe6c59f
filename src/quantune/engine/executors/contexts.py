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

import os

from quantune.forkserver import PRELOAD, uses_fork_server, warm_up, worker_context

__all__ = [
    "PRELOAD",
    "adopt_environment",
    "check_main_importable",
    "child_environment",
    "uses_fork_server",
    "warm_up",
    "worker_context",
]


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


def child_environment() -> dict[str, str]:
    """The environment a worker must see: the parent's, now (the fork server's is its own, older)."""
    return dict(os.environ)


def adopt_environment(environment: dict[str, str] | None) -> None:
    """In the worker, first: the parent's environment replaces the fork server's."""
    if environment is None:
        return
    os.environ.clear()
    os.environ.update(environment)
