"""A content-addressed cache of pass outputs, evaluations and reference outputs.

Keys hash everything that determines a result, so a changed input never hits a stale entry.
Entries are written then renamed (a crash leaves nothing or a whole entry), models are checked
against their hash on read, and a deleted cache is made again as entries are put.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from quantune.memory import reused_blocks
from quantune.model import files_sha256
from quantune.store.faults import check_space, probe_writable, storage_errors

_FIELD = "cache_dir (or $QUANTUNE_CACHE_DIR)"
_ARRAYS_HASH = "__sha256__"


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
        with storage_errors(self.root, _FIELD):
            for sub in ("models", "evals", "outputs", "tmp"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
        probe_writable(self.root / "tmp", _FIELD)  # a read-only cache is named now, not in a worker

    # -- models -------------------------------------------------------------------------------
    def _model_dir(self, key: str) -> Path:
        return self.root / "models" / key

    def get_model(self, key: str) -> tuple[Path, str] | None:
        """The cached model for ``key`` and its sha256, or ``None`` (also when the entry was corrupt);
        hashed in full on first read, then trusted while its size and modification time hold."""
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
        with storage_errors(self.root / "tmp", _FIELD):
            (self.root / "tmp").mkdir(parents=True, exist_ok=True)  # (the cache may have been deleted)
            return Path(tempfile.mkdtemp(dir=self.root / "tmp"))

    def put_model(self, key: str, work_dir: Path, meta: dict[str, Any]) -> tuple[Path, str]:
        """Moves ``work_dir`` (holding ``model.onnx``) into the cache as the entry for ``key``; a full
        file system fails the put before the entry exists."""
        try:
            with storage_errors(work_dir, _FIELD):
                check_space(work_dir)
                record = {**meta, "sha256": _entry_sha256(work_dir)}
                _atomic_write(work_dir / "meta.json", json.dumps(record, indent=1, default=str).encode())
        except BaseException:
            shutil.rmtree(work_dir, ignore_errors=True)
            raise
        target = self._model_dir(key)
        if not target.parent.is_dir():  # the first model, or the cache was deleted meanwhile
            with storage_errors(target.parent, _FIELD):
                target.parent.mkdir(parents=True, exist_ok=True)
        existing = self.get_model(key)  # (a corrupt entry is removed by get_model)
        if existing is not None:
            # Another worker put the same entry first, and may be using it: keep theirs.
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
        """The record for ``key``, or ``None`` (also when it was corrupt or fails its hash)."""
        path = self.root / kind / f"{key}.json"
        try:
            envelope = json.loads(path.read_text())
            value = envelope["value"]
            if envelope["sha256"] != _json_sha256(value):
                raise ValueError("hash mismatch")
            return value
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):  # cut short, altered, or an older format
            path.unlink(missing_ok=True)
            return None

    def put_json(self, kind: str, key: str, value: dict[str, Any]) -> None:
        folder = self.root / kind
        value = json.loads(json.dumps(value, default=str))  # as it will read back
        envelope = {"sha256": _json_sha256(value), "value": value}
        with storage_errors(folder, _FIELD):
            _in_folder(folder, lambda: _atomic_write(folder / f"{key}.json", json.dumps(envelope, indent=1).encode()))

    # -- arrays -------------------------------------------------------------------------------
    def get_arrays(self, key: str) -> dict[str, np.ndarray] | None:
        path = self.root / "outputs" / f"{key}.npz"
        try:
            with reused_blocks(), np.load(path, allow_pickle=False) as archive:  # read through equal buffers
                arrays = {name: archive[name] for name in archive.files}
            expected = str(arrays.pop(_ARRAYS_HASH))
            if expected != _arrays_sha256(arrays):
                raise ValueError("hash mismatch")
            return arrays
        except FileNotFoundError:
            return None
        except Exception:
            path.unlink(missing_ok=True)
            return None

    def put_arrays(self, key: str, arrays: dict[str, np.ndarray]) -> None:
        target = self.root / "outputs" / f"{key}.npz"
        tmp = target.with_name(f".{uuid.uuid4().hex}.npz")
        arrays = {name: np.asarray(value) for name, value in arrays.items()}

        def write() -> None:
            try:
                with reused_blocks():  # written through equal buffers
                    np.savez(tmp, **arrays, **{_ARRAYS_HASH: np.array(_arrays_sha256(arrays))})
                os.replace(tmp, target)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise

        with storage_errors(target.parent, _FIELD):
            _in_folder(target.parent, write)


def _entry_sha256(folder: Path) -> str:
    """A model entry's identity: ``model.onnx`` and any external-data files a pass wrote beside it."""
    others = [p for p in folder.rglob("*") if p.is_file() and p.name not in ("model.onnx", "meta.json")]
    return files_sha256(folder / "model.onnx", others)


def _json_sha256(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _arrays_sha256(arrays: dict[str, np.ndarray]) -> str:
    """Names, dtypes, shapes and bytes of every array, in name order."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        # the array's own buffer (not the copy tobytes() would make of large outputs)
        digest.update(memoryview(array).cast("B") if array.size and not array.dtype.hasobject else array.tobytes())
    return digest.hexdigest()


def _in_folder(folder: Path, write: Callable[[], None]) -> None:
    """``write()``, making ``folder`` only when missing: one failed write then, not a ``mkdir`` every put."""
    try:
        write()
    except FileNotFoundError:
        folder.mkdir(parents=True, exist_ok=True)
        write()


def _atomic_write(path: Path, data: bytes) -> None:
    """``data`` at ``path`` whole or not at all: a failed write (disk full) leaves no temporary behind."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
