"""The run's output folder: claimed safely (``run.lock``), never clobbering what a user put there.
A run that fails before any trial finished removes what it created, so no ``--restart`` is needed."""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from quantune.engine.trials.identity import changed_sources
from quantune.errors import QuantuneError
from quantune.store import RunStore
from quantune.store.faults import storage_errors
from quantune.store.lock import LOCK_NAME, RunLock

RUN_DB = "run.db"
_STORE_FILES = (RUN_DB, f"{RUN_DB}-wal", f"{RUN_DB}-shm")
_OURS = {
    *_STORE_FILES,
    "results.json",
    "quantune.log",
    "config.json",
    "best",
    "closest_miss",
    "unconfirmed",
    "workers",
    "report.html",
    LOCK_NAME,
    "optuna.journal",
    "optuna.db",  # an earlier version's study file
}
_HARMLESS = {LOCK_NAME, "workers", "quantune.log"}  # left by a run stopped before its store existed


@dataclass(frozen=True)
class _Claim:
    """What a run found in its output folder when it claimed it (what it may take back)."""

    created_folder: bool
    existed: set[str]


_CLAIMS: dict[int, _Claim] = {}  # id(store) -> its claim, while the store is open


def open_output(
    folder: Path,
    config_hash: str,
    *,
    restart: bool,
    protected: list[Path],
    sources: Mapping[str, Mapping[str, str]] | None = None,
    cache: Path | None = None,
) -> RunStore:
    """Opens (or creates) the run store in ``folder``.

    A folder holding another config's run is refused unless ``restart``, one holding files quantune
    did not write always; ``protected`` files may never lie inside what quantune rewrites. ``sources``
    are kept so a refusal names what changed. ``cache``: the run's cache folder.
    """
    folder = folder.resolve()
    ours = set(_OURS)
    if cache is not None and folder in cache.resolve().parents:
        top = cache.resolve().relative_to(folder).parts[0]
        if top in _OURS:  # a run rewrites or takes back these: the cache would go with them
            raise QuantuneError(
                f"cache_dir: '{cache}' lies in '{folder / top}', which quantune rewrites; "
                f"choose another cache_dir (e.g. '{folder / 'cache'}')"
            )
        ours.add(top)
    rewritten = [
        folder / name for name in ("best", "closest_miss", "unconfirmed", "results.json", "config.json", RUN_DB)
    ]
    for path in protected:
        resolved = path.resolve()
        if any(resolved == place or place in resolved.parents for place in rewritten):
            raise QuantuneError(f"--output: '{folder}' would overwrite the input file '{path}'; choose another folder")
    if folder.exists() and not folder.is_dir():
        raise QuantuneError(f"--output: '{folder}' is a file, not a folder")
    if folder.is_dir():
        foreign = sorted(p.name for p in folder.iterdir() if p.name not in ours)
        if foreign and not (folder / RUN_DB).exists():
            raise QuantuneError(
                f"--output: '{folder}' already holds files quantune did not write ({', '.join(foreign[:3])}...); "
                "choose an empty or new folder"
            )
        # quantune's names but no run store: what they hold may be the user's, never replaced unasked
        results = sorted(p.name for p in folder.iterdir() if p.name in _OURS and p.name not in _HARMLESS)
        if results and not (folder / RUN_DB).exists() and not restart:
            raise QuantuneError(
                f"--output: '{folder}' holds {', '.join(results[:3])} but no quantune run ({RUN_DB}); choose "
                "another --output folder, or pass --restart to replace them"
            )
    created_folder = not folder.exists()
    with storage_errors(folder, "--output"):
        folder.mkdir(parents=True, exist_ok=True)
    existing = {name for name in _OURS if (folder / name).exists()}  # as found, before this run wrote
    try:
        lock = RunLock.acquire(folder)  # before anything in the folder is read or changed
    except QuantuneError:  # held by another run (which may have made the folder): not ours to touch
        raise
    except BaseException:
        if created_folder:
            shutil.rmtree(folder, ignore_errors=True)  # made a moment ago: nothing but ours is in it
        raise
    try:
        store = RunStore(folder / RUN_DB, lock=lock)
    except BaseException:  # e.g. a full disk: take back the store files and the folder this run made
        for name in _STORE_FILES:
            if name not in existing:
                with contextlib.suppress(OSError):
                    (folder / name).unlink()
        lock.release(remove=created_folder)
        if created_folder:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    _CLAIMS[id(store)] = _Claim(created_folder, existing)
    try:
        return _claim(store, folder, config_hash, restart, sources)
    except BaseException:
        close_output(store, failed=True)
        raise


def _claim(
    store: RunStore,
    folder: Path,
    config_hash: str,
    restart: bool,
    sources: Mapping[str, Mapping[str, str]] | None,
) -> RunStore:
    previous = store.get_meta("config_hash")
    if previous is not None and previous != config_hash and not restart:
        changed = changed_sources(store.get_meta("sources") or {}, sources or {}) if store.get_meta("sources") else []
        if changed:
            raise QuantuneError(
                f"--output '{folder}': {', '.join(changed)} changed since this run started; pass --restart "
                "to replace the run, or choose another --output folder"
            )
        raise QuantuneError(
            f"--output: '{folder}' holds a run of a different config; pass --restart to replace it, "
            "or choose another --output folder"
        )
    if previous != config_hash or restart:
        store.clear()
        for stale in ("best", "closest_miss", "unconfirmed"):  # another config's models
            shutil.rmtree(folder / stale, ignore_errors=True)
    # Same config: the stored trials are resumed; best/ stays until the run's end rewrites it.
    (folder / "results.json").unlink(missing_ok=True)
    store.set_meta("config_hash", config_hash)
    if sources is not None:
        store.set_meta("sources", dict(sources))
    return store


def close_output(store: RunStore, *, failed: bool) -> None:
    """Closes the run store and releases the folder; a ``failed`` run with no finished trial takes back
    what it created, so a fixed config runs next time without ``--restart``."""
    folder = store.path.parent
    claim = _CLAIMS.pop(id(store), _Claim(False, set(_OURS)))
    cleanup = False
    if failed:
        with contextlib.suppress(Exception):
            cleanup = not store.trials()
    with contextlib.suppress(Exception):
        store._conn.close()
    if cleanup:
        existed = claim.existed
        for name in sorted(_OURS - {LOCK_NAME}):
            if name in existed and name not in _STORE_FILES:
                continue  # a file of an earlier run, not this one's to take back
            path = folder / name
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
    made_folder = claim.created_folder
    if store.lock is not None:
        store.lock.release(remove=cleanup and (made_folder or LOCK_NAME not in claim.existed))
        store.lock = None
    if cleanup and made_folder:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only if empty: nothing but ours was in it


def attach_log(path: Path) -> tuple[logging.Handler, int]:
    """Sends this run's log (and onnxruntime's quantization warnings) to ``quantune.log``."""
    handler = logging.FileHandler(path, mode="a")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    previous = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler, previous


def detach_log(attached: tuple[logging.Handler, int]) -> None:
    handler, previous = attached
    root = logging.getLogger()
    root.removeHandler(handler)
    root.setLevel(previous)
    handler.close()
