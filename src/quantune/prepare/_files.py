"""Saving a prepared model, whatever its size."""

from __future__ import annotations

from pathlib import Path

import onnx

_SINGLE_FILE_LIMIT = 1_800_000_000  # protobuf's 2 GB limit, with room for the graph


def save_model(model: onnx.ModelProto, path: Path) -> None:
    """``model`` at ``path``; weights beyond protobuf's 2 GB limit go to ``<name>.data`` beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if model.ByteSize() > _SINGLE_FILE_LIMIT:
        onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data")
    else:
        onnx.save(model, str(path))
