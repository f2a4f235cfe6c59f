"""Worker processes never outlive the run, and a full disk stops the run instead of failing trials.

A worker asks for SIGKILL when its parent dies, with a watchdog thread where that is missing.
A full disk is no failure of a trial's parameters (every later trial would fail alike), so
:func:`storage_fault` lets the executor raise :class:`~quantune.errors.DiskFull` instead.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

from quantune.engine.trials.trial import TrialRecord
from quantune.errors import DiskFull
from quantune.store.faults import LOW_SPACE_BYTES, free_bytes

_PR_SET_PDEATHSIG = 1
_WATCH_INTERVAL_S = 1.0
_WRITING = re.compile(r"No space left on device writing (\S+)")


def die_with_parent(parent_pid: int) -> None:
    """Called first in a worker: it ends (SIGKILL, or ``os._exit``) as soon as ``parent_pid`` is gone."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog below still notices
    # A forked worker is the fork server's child: killed with it; the run's PID is watched too.
    if not _alive(parent_pid):  # the parent died before the request took effect
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(_WATCH_INTERVAL_S)
            if not _alive(parent_pid):
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="quantune-parent-watchdog").start()


def _alive(pid: int) -> bool:
    """Whether the process ``pid`` still runs (our parent, or the run that started the fork server)."""
    if os.getppid() == pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


def storage_fault(record: TrialRecord, cache_root: Path | None, *others: Path) -> DiskFull | None:
    """The :class:`DiskFull` behind a failed trial, or ``None`` when the disk is not the cause.

    The cache's file system being (all but) full counts too: native model writers may stop short
    silently, and the trial then fails on a truncated model. ``others``: more folders to check.
    """
    if record.status != "failed":
        return None
    error = f"{record.error or ''}\n{getattr(record, 'log_tail', '') or ''}"
    named = _WRITING.search(error)
    if named:
        return DiskFull(named.group(1))
    if "No space left on device" in error or "Disk quota exceeded" in error or "disk is full" in error:
        return DiskFull(cache_root or "the cache")
    for root in [cache_root, *others]:
        free = None if root is None else free_bytes(root)
        if free is not None and free < LOW_SPACE_BYTES:
            return DiskFull(root)
    return None


def enter_worker(log_path: str, memory_limit_mb: int | None, parent_pid: int | None) -> None:
    """What every child process of a run does first: die with the run, log to its own file, leave
    Ctrl-C and SIGTERM to the engine, stay within the memory limit, and return large freed blocks."""
    import faulthandler
    import logging

    from quantune.memory import return_large_blocks

    if parent_pid is not None:
        die_with_parent(parent_pid)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    faulthandler.enable(sys.stderr)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.raiseExceptions = False  # a log line lost to a full disk fails no trial
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return_large_blocks()
    if memory_limit_mb:
        import resource

        limit = int(memory_limit_mb) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
