"""Storage faults in words: a full disk or a read-only folder becomes one line naming the path.

Never a traceback, and never a trial that "failed" for a reason no later trial can escape.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from quantune.errors import DiskFull, QuantuneError

FULL = {errno.ENOSPC, errno.EDQUOT}
READ_ONLY = {errno.EROFS, errno.EACCES, errno.EPERM}
# A path that cannot be a folder: a file in the way, a missing or unwritable parent (/proc/nope)
IN_THE_WAY = {errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.ENOENT, errno.ENAMETOOLONG, errno.ELOOP}
# Below this many free bytes the file system counts as full: native writers may not report a short write.
LOW_SPACE_BYTES = 64 * 1024


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` or anything in its chain is a full disk (errno or SQLite's wording)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFull):
            return True
        if isinstance(exc, OSError) and exc.errno in FULL:
            return True
        if isinstance(exc, sqlite3.OperationalError) and "disk is full" in str(exc):
            return True
        text = str(exc)
        if "No space left on device" in text or "Disk quota exceeded" in text:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def written_path(exc: OSError, default: object = "a file") -> object:
    """The file a failed write was writing: a copy's error (shutil's sendfile) names the source
    first and the destination -- the full one -- second."""
    return exc.filename2 or exc.filename or default


def free_bytes(path: Path) -> int | None:
    """Free bytes for an unprivileged writer on ``path``'s file system (``None``: unknown)."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def check_space(path: Path) -> None:
    """Raises :class:`DiskFull` when ``path``'s file system is (all but) full."""
    free = free_bytes(path)
    if free is not None and free < LOW_SPACE_BYTES:
        raise DiskFull(path)


def not_writable(field: str, path: Path, exc: OSError) -> QuantuneError:
    reason = exc.strerror or type(exc).__name__
    return QuantuneError(f"{field}: '{path}' is not writable ({reason}); choose a folder you can write to")


def cannot_create(field: str, path: Path, exc: OSError) -> QuantuneError:
    """A folder that cannot be made where ``field`` points: names the file in its way, if any."""
    blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        return QuantuneError(f"{field}: '{blocker}' is a file, not a folder; choose a folder (or remove the file)")
    reason = exc.strerror or type(exc).__name__
    return QuantuneError(f"{field}: cannot create '{path}' ({reason}); choose a folder you can write to")


@contextlib.contextmanager
def storage_errors(path: Path, field: str, *, refused: bool = True) -> Iterator[None]:
    """Turns a full disk into :class:`DiskFull` and (``refused``) a refused write into a one-line
    :class:`QuantuneError` naming ``field`` (the config field or option that chose ``path``)."""
    try:
        yield
    except DiskFull:
        raise
    except sqlite3.OperationalError as exc:
        if is_disk_full(exc):
            raise DiskFull(path) from None
        if refused and ("readonly" in str(exc) or "read-only" in str(exc)):
            raise QuantuneError(
                f"{field}: '{path}' is not writable ({exc}); choose a folder you can write to"
            ) from None
        raise
    except OSError as exc:
        if exc.errno in FULL:
            raise DiskFull(written_path(exc, path)) from None
        if refused and exc.errno in READ_ONLY:
            raise not_writable(field, Path(exc.filename or path), exc) from None
        if refused and exc.errno in IN_THE_WAY:
            raise cannot_create(field, Path(exc.filename or path), exc) from None
        raise


def probe_writable(folder: Path, field: str) -> None:
    """Creates and removes a file in ``folder``, so a read-only folder fails here with its name
    (``os.access`` is no proof: root passes it)."""
    with storage_errors(folder, field):
        probe = folder / f".quantune-probe-{os.getpid()}"
        try:
            with open(probe, "wb") as handle:
                handle.write(b"ok")
        finally:
            with contextlib.suppress(OSError):
                probe.unlink()
