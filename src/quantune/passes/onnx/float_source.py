"""Which float model a QDQ model was quantized from, for the passes that fit it to that model.

A pass sees only its input, so ``static_quant`` records for every model it writes a copy of the
float model it read, under ``<cache>/passes/float_sources/``: keyed by the QDQ model's sha256,
one copy per distinct float model.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from quantune.errors import TrialError
from quantune.model import external_data_files, file_sha256

_FOLDER = "float_sources"


def _root(cache_dir: Path) -> Path:
    """``cache_dir`` is a pass's own folder (``<cache>/passes/<pass>``): the store sits beside it."""
    return cache_dir.parent / _FOLDER


def remember_float_source(qdq_model: Path, float_model: Path, float_sha: str, cache_dir: Path | None) -> None:
    """Records that ``qdq_model`` was quantized from ``float_model`` (no-op without a cache)."""
    if cache_dir is None:
        return
    root = _root(cache_dir)
    sha = float_sha or file_sha256(float_model)
    folder = root / "models" / sha
    if not (folder / "model.onnx").is_file():
        tmp = root / "tmp" / uuid.uuid4().hex
        tmp.mkdir(parents=True, exist_ok=True)
        source = Path(os.path.abspath(float_model))
        for file in [source, *external_data_files(source)]:
            target = tmp / ("model.onnx" if file == source else file.relative_to(source.parent))
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, target)
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(tmp, folder)
        except OSError:  # another worker put the same copy first
            shutil.rmtree(tmp, ignore_errors=True)
    record = root / "records" / f"{file_sha256(qdq_model)}.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    partial = record.with_name(f".{record.name}.{uuid.uuid4().hex}")
    partial.write_text(json.dumps({"float_sha256": sha}))
    os.replace(partial, record)


def find_float_source(qdq_model: Path, cache_dir: Path | None, pass_name: str) -> Path:
    """The float model ``qdq_model`` was quantized from; a ``TrialError`` naming ``pass_name`` when unknown."""
    if cache_dir is None:
        raise TrialError(
            f"{pass_name} needs the artifact cache (it finds the float model static_quant quantized there)"
        )
    root = _root(cache_dir)
    record = root / "records" / f"{file_sha256(qdq_model)}.json"
    try:
        sha = json.loads(record.read_text())["float_sha256"]
    except (OSError, ValueError, KeyError):
        raise TrialError(
            f"{pass_name} runs after static_quant (quant_format QDQ) in a flow: its input was not made by static_quant"
        ) from None
    path = root / "models" / sha / "model.onnx"
    if not path.is_file():
        raise TrialError(f"{pass_name}: the float model of its input is gone from the cache ({path})")
    return path
