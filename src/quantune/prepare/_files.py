"""Saving a prepared model, whatever its size."""

from __future__ import annotations

from pathlib import Path

import onnx

_SINGLE_FILE_LIMIT = 1_800_000_000  # protobuf's 2 GB limit, with room for the graph


def save_model(model: onnx.ModelProto, path: Path) -> None:
    """``model`` at ``path``; weights beyond protobuf's 2 GB limit go to ``<name>.data`` beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if _initializer_bytes(model) < _SINGLE_FILE_LIMIT // 2:
        # far below the limit: saved at once (``ByteSize`` costs as much as the save); protobuf refuses
        # a message over 2 GB before writing anything, and the exact size then decides
        try:
            onnx.save(model, str(path))
            return
        except ValueError:
            pass
    if model.ByteSize() > _SINGLE_FILE_LIMIT:
        onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data")
    else:
        onnx.save(model, str(path))


def _initializer_bytes(model: onnx.ModelProto) -> int:
    """The main graph's initializers' size (raw bytes; others by their message size)."""
    return sum(
        len(tensor.raw_data) if tensor.HasField("raw_data") else tensor.ByteSize() for tensor in model.graph.initializer
    )
