"""A dataset is a dict of equal-length arrays: model inputs by input name, plus labels.

Sources are `.npz` files (keys = model input names, plus the label key) or a Python function
named as ``path/to/script.py:function``. The function runs only when a config names it; it
may return a dict of arrays, or an iterable of such dicts (batches), which are concatenated.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from quantune.errors import QuantuneError
from quantune.userimport import load_function


@dataclass(frozen=True)
class Dataset:
    """Arrays that share their first axis. ``fingerprint`` identifies the content for caching."""

    arrays: Mapping[str, np.ndarray]
    source: str

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    @cached_property
    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for key in sorted(self.arrays):
            array = np.ascontiguousarray(self.arrays[key])
            digest.update(key.encode())
            digest.update(str(array.dtype).encode())
            digest.update(str(array.shape).encode())
            digest.update(array.tobytes())
        return digest.hexdigest()

    def inputs(self, names: Iterable[str]) -> dict[str, np.ndarray]:
        """The arrays feeding the model, checked against the model's input names."""
        names = list(names)
        missing = [name for name in names if name not in self.arrays]
        if missing:
            raise QuantuneError(
                f"{self.source}: has no array for model input(s) {missing}; "
                f"it has {sorted(self.arrays)} (name the arrays after the model's inputs {names})"
            )
        return {name: self.arrays[name] for name in names}

    def batches(self, names: Iterable[str], batch_size: int, limit: int | None = None) -> Iterator[dict]:
        """Model-input batches of ``batch_size`` rows, at most ``limit`` rows in all."""
        feeds = self.inputs(names)
        total = len(self) if limit is None else min(limit, len(self))
        for start in range(0, total, batch_size):
            stop = min(start + batch_size, total)
            yield {name: array[start:stop] for name, array in feeds.items()}


def _load_npz(path: Path, field_name: str) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise QuantuneError(f"{field_name}: no file at '{path}' (expected an .npz file or script.py:function)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except Exception as exc:
        raise QuantuneError(f"{field_name}: '{path}' is not a readable .npz file ({exc})") from None


def _from_function(spec: str, field_name: str, base_dir: Path) -> dict[str, np.ndarray]:
    func = load_function(spec, field_name, base_dir)
    try:
        produced = func()
    except Exception as exc:
        raise QuantuneError(f"{field_name}: '{spec}' raised {type(exc).__name__}: {exc}") from None
    if isinstance(produced, Mapping):
        return {key: np.asarray(value) for key, value in produced.items()}
    chunks: dict[str, list[np.ndarray]] = {}
    for batch in produced:
        if not isinstance(batch, Mapping):
            raise QuantuneError(
                f"{field_name}: '{spec}' must return a dict of arrays or an iterable of such dicts, "
                f"got an item of type {type(batch).__name__}"
            )
        for key, value in batch.items():
            chunks.setdefault(key, []).append(np.asarray(value))
    if not chunks:
        raise QuantuneError(f"{field_name}: '{spec}' returned no batches")
    return {key: np.concatenate(parts, axis=0) for key, parts in chunks.items()}


def load_dataset(spec: str, *, field_name: str, base_dir: Path) -> Dataset:
    """Loads a data source named in a config; paths are relative to the config's folder."""
    if spec.endswith(".npz"):
        arrays = _load_npz((base_dir / spec).resolve(), field_name)
    elif ".py:" in spec:
        arrays = _from_function(spec, field_name, base_dir)
    else:
        raise QuantuneError(f"{field_name}: '{spec}' is neither an .npz file nor 'path/to/script.py:function'")
    if not arrays:
        raise QuantuneError(f"{field_name}: '{spec}' holds no arrays")
    lengths = {key: len(value) for key, value in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise QuantuneError(f"{field_name}: arrays in '{spec}' differ in length along axis 0: {lengths}")
    return Dataset(arrays=arrays, source=field_name)
