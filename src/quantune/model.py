"""Model handles: a path on disk plus what the engine needs to know about it.

The content hash is the model's identity in the cache: two files with the same bytes are the
same model wherever they live, so a pass that produced them runs once.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import Message
from onnx import TensorProto

from quantune.errors import QuantuneError

_CHUNK = 1 << 20


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """The graph and every subgraph (If/Loop/Scan bodies) inside it, depth first."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from graphs(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for sub in attribute.graphs:
                    yield from graphs(sub)


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks so large models never sit in memory twice."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def external_data_files(path: str | Path) -> list[Path]:
    """The files holding ``path``'s external data, sorted: part of the model for hashing, size and copies."""
    path = Path(path)
    if all(entry.name in (path.name, "meta.json") for entry in os.scandir(path.parent)):
        return []  # alone in its folder (every cache entry of a single-file model): nothing to parse
    return _external_data_of(onnx.load(str(path), load_external_data=False), path)


def model_size_bytes(path: str | Path) -> int:
    """Bytes on disk of the model at ``path``, its external-data files included."""
    return Path(path).stat().st_size + sum(data.stat().st_size for data in external_data_files(path))


def _external_data_of(model: onnx.ModelProto, path: Path) -> list[Path]:
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    locations = {ExternalDataInfo(tensor).location for tensor in _get_all_tensors(model) if uses_external_data(tensor)}
    # onnx and onnxruntime refuse locations outside the model's folder; so do we.
    inside = [
        location for location in locations if not Path(location).is_absolute() and ".." not in Path(location).parts
    ]
    return sorted(path.parent / location for location in inside)


def files_sha256(model: str | Path, others: list[Path]) -> str:
    """The identity of a model stored as several files: the model file's hash when it is alone."""
    if not others:
        return file_sha256(model)
    digest = hashlib.sha256(file_sha256(model).encode())
    base = Path(model).parent
    for other in sorted(others):
        digest.update(f"\0{other.relative_to(base).as_posix()}\0{file_sha256(other)}".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class _Graph:
    """What the engine reads from a model's graph, taken in one parse (the weights are not kept)."""

    nodes: list[tuple[str, str]]
    input_names: list[str]
    external_data: list[Path]


def _graph_of(model: onnx.ModelProto, path: Path) -> _Graph:
    initializers = {init.name for init in model.graph.initializer}
    return _Graph(
        nodes=[(node.name, node.op_type) for node in model.graph.node],
        input_names=[inp.name for inp in model.graph.input if inp.name not in initializers],
        external_data=_external_data_of(model, path),
    )


@dataclass(frozen=True)
class ModelHandle:
    """An ONNX model file. Cheap to create; hashing and parsing happen once, on first use."""

    path: Path

    @classmethod
    def from_path(cls, path: str | Path, *, field_name: str = "model") -> ModelHandle:
        resolved = Path(path).expanduser().resolve()
        if not resolved.is_file():
            raise QuantuneError(f"{field_name}: no file at '{path}' (expected an .onnx model file)")
        try:
            model = onnx.load(str(resolved), load_external_data=False)
        except Exception as exc:  # onnx raises DecodeError and friends; all mean "not an ONNX file"
            raise QuantuneError(
                f"{field_name}: '{path}' does not load as an ONNX model ({type(exc).__name__}: {exc})"
            ) from None
        if not model.graph.node or not model.graph.output:
            # An empty file parses as an empty ModelProto: say so here, not in a failed evaluation later.
            raise QuantuneError(f"{field_name}: '{path}' is not an ONNX model (it has no graph nodes or outputs)")
        graph = _graph_of(model, resolved)
        missing = [str(data.relative_to(resolved.parent)) for data in graph.external_data if not data.is_file()]
        if missing:  # else the hash would fail on them with the bare OS message
            raise QuantuneError(
                f"{field_name}: '{path}' keeps its weights in external data file(s) {', '.join(missing)} that "
                f"are not in '{resolved.parent}'; copy them beside the model as they were saved with it, or "
                "give a model saved as one file (onnx.save(model, path, save_as_external_data=False))"
            )
        if not graph.input_names:  # its outputs are constants: nothing to feed, calibrate or measure
            raise QuantuneError(
                f"{field_name}: '{path}' has no inputs (every graph input is a weight or there are none); "
                "quantune tunes a model that computes its outputs from input data"
            )
        handle = cls(resolved)
        handle.__dict__["_graph"] = graph  # this parse serves every later question
        return handle

    @cached_property
    def _graph(self) -> _Graph:
        return _graph_of(onnx.load(str(self.path), load_external_data=False), self.path)

    @property
    def external_data(self) -> list[Path]:
        return self._graph.external_data

    @cached_property
    def sha256(self) -> str:
        self.__dict__["_hashed_stamp"] = self._file_stamp()  # before the bytes are read: a change meanwhile shows later
        return files_sha256(self.path, self.external_data)

    def _file_stamp(self) -> tuple[tuple[int, int, int], ...] | None:
        """Size, modification time and inode of each file (``None`` when one is gone)."""
        try:
            stats = [file.stat() for file in (self.path, *self.external_data)]
        except OSError:
            return None
        return tuple((stat.st_size, stat.st_mtime_ns, stat.st_ino) for stat in stats)

    def current_sha256(self) -> str | None:
        """The content hash of the files as they are now (``None`` when one is gone or unreadable):
        hashed again only when a file's size, modification time or inode differ from when it was
        last hashed, so asking before every use costs a few ``stat`` calls."""
        expected = self.sha256
        stamp = self._file_stamp()
        if stamp is None:
            return None
        if stamp == self.__dict__.get("_hashed_stamp"):
            return expected
        try:
            now = files_sha256(self.path, self.external_data)
        except OSError:
            return None
        if now == expected:
            self.__dict__["_hashed_stamp"] = stamp
        return now

    @property
    def size_bytes(self) -> int:
        return self.path.stat().st_size + sum(data.stat().st_size for data in self.external_data)

    def nodes(self) -> list[tuple[str, str]]:
        return list(self._graph.nodes)

    def input_names(self) -> list[str]:
        return list(self._graph.input_names)


# Initializers whose values shape inference never reads (it reads small integer tensors only).
_WEIGHT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
_KEPT_ELEMENTS = 1024  # initializers up to this size keep their values (shape constants are small integers)


# The fields of a TensorProto that hold its values (all the others describe it).
VALUE_FIELDS = frozenset(
    {"raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data"}
)


def stripped(
    model: onnx.ModelProto, strip: Callable[[int, TensorProto], bool], *, external: bool = False
) -> onnx.ModelProto:
    """A copy of ``model`` whose initializers picked by ``strip(index, tensor)`` keep every field but
    their values, built without copying those values (copying a large model per shape costs seconds).
    ``external``: they are marked external data, as onnx's shape inference shows them."""
    light = onnx.ModelProto()
    copy_fields(model, light, skip="graph")
    copy_fields(model.graph, light.graph, skip="initializer")
    for index, tensor in enumerate(model.graph.initializer):
        target = light.graph.initializer.add()
        if not strip(index, tensor):
            target.CopyFrom(tensor)
            continue
        copy_fields(tensor, target, skip=VALUE_FIELDS)
        if external:
            target.data_location = TensorProto.EXTERNAL
    return light


def copy_fields(source: Any, target: Any, *, skip: str | frozenset[str]) -> None:
    """Every set field of the protobuf message ``source`` but ``skip`` onto ``target``."""
    skipped = {skip} if isinstance(skip, str) else skip
    for field, value in source.ListFields():
        if field.name in skipped:
            continue
        if _repeated(field):
            getattr(target, field.name).extend(value)
        elif isinstance(value, Message):
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def _repeated(field: Any) -> bool:
    repeated = getattr(field, "is_repeated", None)
    return bool(repeated) if repeated is not None else field.label == field.LABEL_REPEATED


def without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the values of its large float initializers left out, their type and dims
    kept: shape inference reads only those (data propagation reads small integer tensors)."""
    return stripped(
        model, lambda _, t: t.data_type in _WEIGHT_TYPES and int(np.prod(t.dims, dtype=np.int64)) > _KEPT_ELEMENTS
    )


def with_weights(light: onnx.ModelProto, model: onnx.ModelProto) -> onnx.ModelProto | None:
    """``light`` -- a result computed from ``without_weights(model)`` -- with ``model``'s weight
    values put back, or ``None`` when the computation touched a weight it was not given (changed
    its dims or type, gave it values, dropped it): the caller then computes on the whole model."""
    stripped = {
        init.name: init
        for init in model.graph.initializer
        if init.data_type in _WEIGHT_TYPES and int(np.prod(init.dims, dtype=np.int64)) > _KEPT_ELEMENTS
    }
    seen = set()
    for init in light.graph.initializer:
        original = stripped.get(init.name)
        if original is None:
            continue
        if init.HasField("raw_data") or init.float_data or list(init.dims) != list(original.dims):
            return None
        if init.data_type != original.data_type or init.name in seen:
            return None
        seen.add(init.name)
        init.CopyFrom(original)
    return light if seen == stripped.keys() else None
