"""Model handles: a path on disk plus what the engine needs to know about it.

The content hash is the model's identity in the cache: two files with the same bytes are the
same model wherever they live, so a pass that produced them runs once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import onnx

from quantune.errors import QuantuneError

_CHUNK = 1 << 20


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks so large models never sit in memory twice."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class ModelHandle:
    """An ONNX model file. Cheap to create; hashing and loading happen on first use."""

    path: Path

    @classmethod
    def from_path(cls, path: str | Path, *, field_name: str = "model") -> ModelHandle:
        """Checks that *path* is a loadable ONNX file and returns its handle."""
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
        return cls(resolved)

    @cached_property
    def sha256(self) -> str:
        return file_sha256(self.path)

    @property
    def size_bytes(self) -> int:
        """Bytes on disk, including external-data files stored beside the model."""
        total = self.path.stat().st_size
        data = self.path.with_name(self.path.name + ".data")
        if data.is_file():
            total += data.stat().st_size
        return total

    def load(self) -> onnx.ModelProto:
        return onnx.load(str(self.path))

    def nodes(self) -> list[tuple[str, str]]:
        """(name, op type) of every node of the main graph, in graph order."""
        model = onnx.load(str(self.path), load_external_data=False)
        return [(node.name, node.op_type) for node in model.graph.node]

    def input_names(self) -> list[str]:
        model = onnx.load(str(self.path), load_external_data=False)
        initializers = {init.name for init in model.graph.initializer}
        return [inp.name for inp in model.graph.input if inp.name not in initializers]
