"""A dataset is either a table (a dict of equal-length arrays, sliced into batches) or a list of feeds.

Feeds may differ in shape and are run as they are: padding changes what the model computes and
re-slicing mixes lengths.
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

Feed = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Dataset:
    """A table (``arrays``, sharing their first axis) or, when ``feeds`` is set, a list of feeds;
    ``fingerprint`` identifies the content for caching and run identity."""

    arrays: Mapping[str, np.ndarray]
    source: str
    feeds: tuple[Feed, ...] | None = None

    @property
    def is_table(self) -> bool:
        return self.feeds is None

    def __len__(self) -> int:
        """Rows: the table's length, or the rows of every feed together."""
        if self.feeds is None:
            return len(next(iter(self.arrays.values()))) if self.arrays else 0
        return sum(feed_rows(feed) for feed in self.feeds)

    def names(self) -> list[str]:
        """Every array name (for feeds: those of the first feed, in order)."""
        if self.feeds is None:
            return list(self.arrays)
        return list(self.feeds[0]) if self.feeds else []

    def has(self, key: str) -> bool:
        if self.feeds is None:
            return key in self.arrays
        return all(key in feed for feed in self.feeds)

    @cached_property
    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        parts: Iterable[Feed] = [self.arrays] if self.feeds is None else self.feeds
        digest.update(b"table" if self.feeds is None else f"feeds:{len(self.feeds)}".encode())
        for part in parts:
            digest.update(b"\x00feed")
            for key in sorted(part):
                array = np.ascontiguousarray(part[key])
                digest.update(key.encode())
                digest.update(str(array.dtype).encode())
                digest.update(str(array.shape).encode())
                digest.update(array.tobytes())
        return digest.hexdigest()

    def inputs(self, names: Iterable[str]) -> None:
        """Checks that every model input has an array (in every feed)."""
        names = list(names)
        parts = [self.arrays] if self.feeds is None else self.feeds
        for index, part in enumerate(parts):
            missing = [name for name in names if name not in part]
            if missing:
                where = "" if self.feeds is None else f" feed {index}"
                raise QuantuneError(
                    f"{self.source}:{where} has no array for model input(s) {missing}; "
                    f"it has {sorted(part)} (name the arrays after the model's inputs {names})"
                )

    def batches(self, names: Iterable[str], batch_size: int, limit: int | None = None) -> Iterator[dict]:
        """What the model is run on: the table in batches of ``batch_size`` rows, or each feed as
        it is (``batch_size`` does not apply). At most ``limit`` rows in all; a feed that would
        cross the limit is still run whole (never cut), unless it is the first."""
        names = list(names)
        self.inputs(names)
        if self.feeds is not None:
            taken = 0
            for feed in self.feeds:
                if limit is not None and taken >= limit:
                    return
                taken += feed_rows(feed)
                yield {name: feed[name] for name in names}
            return
        total = len(self) if limit is None else min(limit, len(self))
        for start in range(0, total, batch_size):
            stop = min(start + batch_size, total)
            yield {name: self.arrays[name][start:stop] for name in names}

    def column(self, key: str) -> np.ndarray | list[np.ndarray]:
        """The array ``key`` stacked along axis 0 when every feed's part stacks, else one per feed."""
        if self.feeds is None:
            return self.arrays[key]
        return stack([feed[key] for feed in self.feeds])

    def parts(self, key: str, batch_size: int) -> list[np.ndarray]:
        """The array ``key`` cut like :meth:`batches` (one part per batch or feed)."""
        return [batch[key] for batch in self.batches([key], batch_size)]

    def view(self) -> dict[str, np.ndarray | list[np.ndarray]]:
        """Every array, for a user metric: stacked when it stacks, else a list with one per feed."""
        return {key: self.column(key) for key in self.names()}


def feed_rows(feed: Feed) -> int:
    """A feed's rows: the first axis of its first array (1 for a scalar)."""
    first = next(iter(feed.values()), None)
    return 1 if first is None or np.ndim(first) == 0 else len(first)


def stack(parts: list[np.ndarray]) -> np.ndarray | list[np.ndarray]:
    """``parts`` concatenated along axis 0 when they agree in dtype and every axis after the first;
    else the list as it is (callers then work per part)."""
    if not parts:
        return parts
    first = parts[0]
    if all(p.ndim >= 1 and p.shape[1:] == first.shape[1:] and p.dtype == first.dtype for p in parts):
        return np.concatenate(parts, axis=0)
    return list(parts)


def _load_npz(path: Path, field_name: str) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise QuantuneError(f"{field_name}: no file at '{path}' (expected an .npz file or script.py:function)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except Exception as exc:
        raise QuantuneError(f"{field_name}: '{path}' is not a readable .npz file ({exc})") from None


def _as_arrays(item: object, what: str) -> dict[str, np.ndarray]:
    if not isinstance(item, Mapping):
        raise QuantuneError(f"{what} is {type(item).__name__}; expected a dict of arrays (name -> array)")
    arrays: dict[str, np.ndarray] = {}
    for key, value in item.items():
        if not isinstance(key, str):
            raise QuantuneError(f"{what} has a key {key!r} of type {type(key).__name__}; keys must be array names")
        try:
            arrays[key] = np.asarray(value)
        except Exception as exc:
            raise QuantuneError(f"{what}: '{key}' is not an array ({type(exc).__name__}: {exc})") from None
        if arrays[key].dtype == object:
            raise QuantuneError(f"{what}: '{key}' is not a numeric array (it holds Python objects)")
    return arrays


def _from_function(spec: str, field_name: str, base_dir: Path) -> dict[str, np.ndarray] | list[dict[str, np.ndarray]]:
    func = load_function(spec, field_name, base_dir)
    expected = "a dict of equal-length arrays, or a list of dicts (feeds)"
    try:
        produced = func()
        if produced is None:
            raise QuantuneError(f"{field_name}: '{spec}' returned None; it must return {expected}")
        if isinstance(produced, Mapping):
            return _as_arrays(produced, f"{field_name}: '{spec}'")
        if isinstance(produced, (str, bytes, np.ndarray)) or not isinstance(produced, Iterable):
            raise QuantuneError(f"{field_name}: '{spec}' returned {type(produced).__name__}; it must return {expected}")
        return [_as_arrays(item, f"{field_name}: '{spec}' feed {i}") for i, item in enumerate(produced)]
    except QuantuneError:
        raise
    except Exception as exc:
        raise QuantuneError(f"{field_name}: '{spec}' raised {type(exc).__name__}: {exc}") from None


def load_dataset(spec: str, *, field_name: str, base_dir: Path) -> Dataset:
    """Loads a data source named in a config; paths are relative to the config's folder."""
    if spec.endswith(".npz"):
        produced: dict | list = _load_npz((base_dir / spec).resolve(), field_name)
    elif ".py:" in spec:
        produced = _from_function(spec, field_name, base_dir)
    else:
        raise QuantuneError(f"{field_name}: '{spec}' is neither an .npz file nor 'path/to/script.py:function'")
    if isinstance(produced, list):
        return _feeds_dataset(produced, spec, field_name)
    if not produced:
        raise QuantuneError(f"{field_name}: '{spec}' holds no arrays")
    scalars = [key for key, value in produced.items() if value.ndim == 0]
    if scalars:
        raise QuantuneError(
            f"{field_name}: arrays {scalars} in '{spec}' are scalars; every array needs a first (row) axis"
        )
    lengths = {key: len(value) for key, value in produced.items()}
    if len(set(lengths.values())) != 1:
        raise QuantuneError(f"{field_name}: arrays in '{spec}' differ in length along axis 0: {lengths}")
    return Dataset(arrays=produced, source=field_name)


def _feeds_dataset(feeds: list[dict[str, np.ndarray]], spec: str, field_name: str) -> Dataset:
    if not feeds:
        raise QuantuneError(f"{field_name}: '{spec}' returned no feeds (an empty list); it needs at least one")
    names = set(feeds[0])
    for index, feed in enumerate(feeds):
        if not feed:
            raise QuantuneError(f"{field_name}: '{spec}' feed {index} holds no arrays")
        if set(feed) != names:
            raise QuantuneError(
                f"{field_name}: '{spec}' feed {index} has arrays {sorted(feed)} but feed 0 has {sorted(names)}; "
                "every feed needs the same names"
            )
    return Dataset(arrays={}, source=field_name, feeds=tuple(feeds))
