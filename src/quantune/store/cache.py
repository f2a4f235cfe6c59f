"""A content-addressed cache of pass outputs, evaluations and reference outputs.

Keys are hashes of everything that determines the result (input model bytes, pass name,
version and config, data fingerprints), so a repeated run or a repeated point never
recomputes, and a changed input can never hit a stale entry. Entries are written to a
temporary name and renamed into place, so a crash leaves either nothing or a whole entry;
models are verified against their recorded hash when read, and a corrupt entry is dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from quantune.model import files_sha256


def cache_key(*parts: Any) -> str:
    """sha256 of the canonical JSON of ``parts``."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def default_cache_dir() -> Path:
    """``$QUANTUNE_CACHE_DIR``, else ``$XDG_CACHE_HOME/quantune``, else ``~/.cache/quantune``."""
    if os.environ.get("QUANTUNE_CACHE_DIR"):
        return Path(os.environ["QUANTUNE_CACHE_DIR"]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "quantune"


class ArtifactCache:
    """Files under ``root``: ``models/<key>/``, ``evals/<key>.json``, ``outputs/<key>.npz``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._verified: dict[str, tuple[int, int, str]] = {}  # key -> (size, mtime_ns, sha256) hashed here
        for sub in ("models", "evals", "outputs", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    # -- models -------------------------------------------------------------------------------
    def _model_dir(self, key: str) -> Path:
        return self.root / "models" / key

    def get_model(self, key: str) -> tuple[Path, str] | None:
        """The cached model for ``key`` and its sha256, or ``None`` (also when the entry was corrupt).

        An entry is hashed in full the first time this process reads it; later reads trust it
        while its model file keeps the size and modification time it had then.
        """
        folder = self._model_dir(key)
        meta_path = folder / "meta.json"
        model_path = folder / "model.onnx"
        try:
            stat = model_path.stat()
        except FileNotFoundError:
            return None
        seen = self._verified.get(key)
        if seen is not None and seen[:2] == (stat.st_size, stat.st_mtime_ns):
            return model_path, seen[2]
        if not meta_path.is_file():
            return None
        try:
            expected = json.loads(meta_path.read_text())["sha256"]
        except (ValueError, KeyError):
            expected = None
        if expected is None or _entry_sha256(folder) != expected:
            shutil.rmtree(folder, ignore_errors=True)
            return None
        self._verified[key] = (stat.st_size, stat.st_mtime_ns, expected)
        return model_path, expected

    def new_work_dir(self) -> Path:
        """A fresh scratch folder on the cache's file system (so results can be renamed in)."""
        return Path(tempfile.mkdtemp(dir=self.root / "tmp"))

    def put_model(self, key: str, work_dir: Path, meta: dict[str, Any]) -> tuple[Path, str]:
        """Moves ``work_dir`` (holding ``model.onnx``) into the cache as the entry for ``key``."""
        record = {**meta, "sha256": _entry_sha256(work_dir)}
        (work_dir / "meta.json").write_text(json.dumps(record, indent=1, default=str))
        target = self._model_dir(key)
        existing = self.get_model(key)  # (a corrupt entry is removed by get_model)
        if existing is not None:
            # Another worker put the same entry first. Theirs is as good as ours, and it may
            # be in use right now by that worker's next pass: keep it, never replace it.
            shutil.rmtree(work_dir, ignore_errors=True)
            return existing
        if target.exists():  # a partial entry (no meta.json yet, or no model): not in use
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(work_dir, target)
        except OSError:  # another worker put the same entry in between; keep theirs
            shutil.rmtree(work_dir, ignore_errors=True)
            existing = self.get_model(key)
            if existing is not None:
                return existing
        return target / "model.onnx", record["sha256"]

    # -- json records -------------------------------------------------------------------------
    def get_json(self, kind: str, key: str) -> dict[str, Any] | None:
        path = self.root / kind / f"{key}.json"
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            path.unlink(missing_ok=True)
            return None

    def put_json(self, kind: str, key: str, value: dict[str, Any]) -> None:
        folder = self.root / kind
        folder.mkdir(parents=True, exist_ok=True)
        _atomic_write(folder / f"{key}.json", json.dumps(value, indent=1, default=str).encode())

    # -- arrays -------------------------------------------------------------------------------
    def get_arrays(self, key: str) -> dict[str, np.ndarray] | None:
        path = self.root / "outputs" / f"{key}.npz"
        try:
            with np.load(path, allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}
        except FileNotFoundError:
            return None
        except Exception:
            path.unlink(missing_ok=True)
            return None

    def put_arrays(self, key: str, arrays: dict[str, np.ndarray]) -> None:
        target = self.root / "outputs" / f"{key}.npz"
        tmp = target.with_name(f".{uuid.uuid4().hex}.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, target)


def _entry_sha256(folder: Path) -> str:
    """A model entry's identity: ``model.onnx`` and any external-data files a pass wrote beside it."""
    others = [p for p in folder.rglob("*") if p.is_file() and p.name not in ("model.onnx", "meta.json")]
    return files_sha256(folder / "model.onnx", others)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
