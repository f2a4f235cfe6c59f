"""One run per output folder: an exclusive ``fcntl`` lock on ``run.lock``, held while the run lives.

The kernel drops the lock when its holder dies, so a dead run's lock is simply taken over; the
holder's PID in the file names it in the refusal.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

from quantune.errors import QuantuneError
from quantune.store.faults import storage_errors

LOCK_NAME = "run.lock"


class RunLock:
    """``RunLock.acquire(folder)`` or a :class:`QuantuneError` naming the PID that holds it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, folder: Path, field: str = "--output") -> RunLock:
        path = folder / LOCK_NAME
        with storage_errors(folder, field):
            while True:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    os.close(fd)
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise
                    holder = _read_pid(path)
                    who = f"PID {holder}" if holder else "another process"
                    raise QuantuneError(
                        f"{field}: '{folder}' is in use by another quantune run ({who}); wait for it to end "
                        "or choose another --output folder"
                    ) from None
                # A file removed between open and lock guards nothing: lock the one there now.
                try:
                    same = os.stat(path).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    break
                os.close(fd)
        with contextlib.suppress(OSError):  # the PID only names the holder; a full disk fails the store next
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(path, fd)

    def release(self, *, remove: bool = False) -> None:
        """Drops the lock (``remove``: deletes the file first, while still holding it)."""
        if self._fd is None:
            return
        if remove:
            with contextlib.suppress(OSError):
                self.path.unlink()
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the last descriptor releases the flock
        self._fd = None


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
