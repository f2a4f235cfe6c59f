"""The run's output folder: claimed safely, never clobbering what a user put there."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from quantune.engine.identity import changed_sources
from quantune.errors import QuantuneError
from quantune.store import RunStore

RUN_DB = "run.db"
_OURS = {
    RUN_DB,
    f"{RUN_DB}-wal",
    f"{RUN_DB}-shm",
    "results.json",
    "quantune.log",
    "config.json",
    "best",
    "closest_miss",
    "workers",
    "report.html",
}


def open_output(
    folder: Path,
    config_hash: str,
    *,
    restart: bool,
    protected: list[Path],
    sources: Mapping[str, Mapping[str, str]] | None = None,
) -> RunStore:
    """Opens (or creates) the run store in ``folder``.

    A folder holding a run of a different config is refused unless ``restart``; a folder
    holding files quantune did not write is refused always; ``protected`` files (the input
    model, the data) may never lie inside the parts quantune rewrites. ``sources`` (see
    identity.py) are kept in the store, so a refusal names the data or script that changed.
    """
    folder = folder.resolve()
    rewritten = [folder / name for name in ("best", "closest_miss", "results.json", "config.json", RUN_DB)]
    for path in protected:
        resolved = path.resolve()
        if any(resolved == place or place in resolved.parents for place in rewritten):
            raise QuantuneError(f"--output: '{folder}' would overwrite the input file '{path}'; choose another folder")
    if folder.exists() and not folder.is_dir():
        raise QuantuneError(f"--output: '{folder}' is a file, not a folder")
    if folder.is_dir():
        foreign = sorted(p.name for p in folder.iterdir() if p.name not in _OURS)
        if foreign and not (folder / RUN_DB).exists():
            raise QuantuneError(
                f"--output: '{folder}' already holds files quantune did not write ({', '.join(foreign[:3])}...); "
                "choose an empty or new folder"
            )
    folder.mkdir(parents=True, exist_ok=True)
    store = RunStore(folder / RUN_DB)
    previous = store.get_meta("config_hash")
    if previous is not None and previous != config_hash and not restart:
        changed = changed_sources(store.get_meta("sources") or {}, sources or {}) if store.get_meta("sources") else []
        store.close()
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
        for stale in ("best", "closest_miss"):  # another config's models
            shutil.rmtree(folder / stale, ignore_errors=True)
    # Same config: the stored trials are resumed (see engine/resume.py); best/ stays until the
    # end of the run rewrites it (its model may be gone from a cleared cache: keep what we have).
    (folder / "results.json").unlink(missing_ok=True)
    store.set_meta("config_hash", config_hash)
    if sources is not None:
        store.set_meta("sources", dict(sources))
    return store
