"""Data checked against the model's inputs before anything runs.

Bad data would otherwise fail every trial inside onnxruntime; here each mistake is one line
naming the source and what the model expects. Dtypes that convert within a kind are converted;
another kind (int64 pixels for a float input) is refused, as it likely was not preprocessed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from quantune.data.dataset import Dataset, Feed
from quantune.errors import QuantuneError


@dataclass(frozen=True)
class InputSpec:
    """One model input: name, element type (None: not a plain tensor) and dims (None: unknown rank;
    an entry None: a free dimension)."""

    name: str
    dtype: np.dtype | None
    dims: tuple[int | None, ...] | None

    def describe(self) -> str:
        dims = "?" if self.dims is None else "[" + ", ".join("?" if d is None else str(d) for d in self.dims) + "]"
        return f"{self.dtype} {dims}"


_INPUTS: dict[tuple[str, int, int], list[InputSpec]] = {}  # (path, mtime, size) -> inputs: one parse per file


def model_inputs(path: Path) -> list[InputSpec]:
    """The graph inputs that are not initializers, as declared in the model file (parsed once
    per file version: the set-up of every worker asks twice about a model of maybe 100 MB)."""
    stat = Path(path).stat()
    key = (str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _INPUTS:
        if len(_INPUTS) >= 8:
            _INPUTS.clear()
        _INPUTS[key] = _read_inputs(path)
    return list(_INPUTS[key])


def _read_inputs(path: Path) -> list[InputSpec]:
    model = onnx.load(str(path), load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type if value.type.HasField("tensor_type") else None
        dtype = None
        dims: tuple[int | None, ...] | None = None
        if tensor is not None:
            try:
                dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
            except Exception:  # undefined or exotic element types: not checked
                dtype = None
            if tensor.HasField("shape"):
                dims = tuple(
                    d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor.shape.dim
                )
        specs.append(InputSpec(value.name, dtype, dims))
    return specs


@dataclass(frozen=True)
class DataChecks:
    """What to check one data source for; ``batch_fields`` name the batch sizes a table is cut by."""

    field: str  # e.g. "data.calibration ('calib.npz')"
    batch_sizes: dict[str, int]  # config field -> rows per batch, e.g. {"data.calibration_batch_size": 32}
    labels: str | None = None  # a label array every part must have
    runner: bool = False  # a runner drives the model: it may supply inputs the data lacks


def check_data(dataset: Dataset, inputs: list[InputSpec], checks: DataChecks) -> Dataset:
    """``dataset`` with castable arrays converted to the model's dtypes; a ``QuantuneError`` on any mistake."""
    if dataset.is_table:
        if len(dataset) == 0:
            raise QuantuneError(f"{checks.field}: holds no rows (every array has length 0); give it at least one row")
        _check_batch_axis(dataset, inputs, checks)
        return replace(dataset, arrays=_check_part(dataset.arrays, inputs, checks, "", table=True))
    assert dataset.feeds is not None
    feeds = tuple(
        _check_part(feed, inputs, checks, f" feed {index}:", table=False) for index, feed in enumerate(dataset.feeds)
    )
    return replace(dataset, feeds=feeds)


def _check_part(part: Feed, inputs: list[InputSpec], checks: DataChecks, where: str, *, table: bool) -> dict:
    names = [spec.name for spec in inputs]
    missing = [name for name in names if name not in part]
    if checks.runner:  # the runner supplies what is missing; what is there must still fit
        inputs = [spec for spec in inputs if spec.name in part]
    elif missing:
        raise QuantuneError(
            f"{checks.field}:{where} no array for model input(s) {missing}; it has {sorted(part)} "
            f"(name the arrays after the model's inputs {names})"
        )
    if checks.labels is not None and checks.labels not in part:
        raise QuantuneError(
            f"{checks.field}:{where} no label array '{checks.labels}' (the metric needs labels; it has {sorted(part)}; "
            "set data.label_key, or use an agreement metric)"
        )
    if checks.labels is not None and np.asarray(part[checks.labels]).dtype.kind not in "biuf":
        raise QuantuneError(
            f"{checks.field}:{where} label array '{checks.labels}' has dtype {np.asarray(part[checks.labels]).dtype}; "
            "labels must be numbers (class indices)"
        )
    if checks.labels is not None:
        labels = np.asarray(part[checks.labels])
        if labels.dtype.kind == "f" and not np.isfinite(labels).all():
            bad = int(labels.size - np.count_nonzero(np.isfinite(labels)))
            raise QuantuneError(
                f"{checks.field}:{where} label array '{checks.labels}' holds {bad} NaN/Inf value(s); "
                "labels must be finite numbers (class indices)"
            )
    checked = dict(part)
    for spec in inputs:
        checked[spec.name] = _check_array(np.asarray(part[spec.name]), spec, checks.field + ":" + where, table=table)
    return checked


def _check_array(array: np.ndarray, spec: InputSpec, where: str, *, table: bool) -> np.ndarray:
    label = f"{where.rstrip(':')}: array '{spec.name}'"
    if array.dtype.kind not in "biuf":
        raise QuantuneError(f"{label} has dtype {array.dtype}; model input '{spec.name}' takes {spec.describe()}")
    if spec.dims is not None and array.ndim != len(spec.dims):
        raise QuantuneError(
            f"{label} has rank {array.ndim} (shape {tuple(array.shape)}); model input '{spec.name}' takes rank "
            f"{len(spec.dims)} {spec.describe()}"
        )
    if array.size == 0:
        raise QuantuneError(f"{label} is empty (shape {tuple(array.shape)}); give it at least one value")
    if spec.dims is not None:
        for axis, size in enumerate(spec.dims):
            if size is None or (table and axis == 0) or array.shape[axis] == size:
                continue
            raise QuantuneError(
                f"{label} has shape {tuple(array.shape)}; model input '{spec.name}' needs {size} along axis {axis} "
                f"({spec.describe()})"
            )
    if spec.dtype is not None and array.dtype != spec.dtype:
        kinds = (_family(array.dtype), _family(spec.dtype))
        if kinds[0] != kinds[1] and kinds != ("boolean", "integer"):  # int64 pixels for a float input: scaled wrongly
            raise QuantuneError(
                f"{label} has dtype {array.dtype} ({_family(array.dtype)}); model input '{spec.name}' takes "
                f"{spec.dtype} ({_family(spec.dtype)}): convert the data as the model expects (e.g. scaled as in "
                f"training) and save it as {spec.dtype}"
            )
        if not np.can_cast(array.dtype, spec.dtype, casting="same_kind"):
            raise QuantuneError(
                f"{label} has dtype {array.dtype}; model input '{spec.name}' takes {spec.dtype}, which {array.dtype} "
                f"does not convert to without changing kind (save it as {spec.dtype})"
            )
        with np.errstate(all="ignore"):
            array = array.astype(spec.dtype)
    if array.dtype.kind == "f" and not np.isfinite(array).all():  # after conversion: 1e300 is inf in float32
        bad = int(array.size - np.count_nonzero(np.isfinite(array)))
        raise QuantuneError(
            f"{label} holds {bad} NaN/Inf value(s) as {array.dtype}; the model's inputs must be finite numbers"
        )
    return array


def _family(dtype: np.dtype) -> str:
    """The kind of number a dtype holds; a conversion within one kind keeps the values' meaning."""
    return {"f": "floating point", "i": "integer", "u": "integer", "b": "boolean"}.get(dtype.kind, dtype.kind)


def _check_batch_axis(dataset: Dataset, inputs: list[InputSpec], checks: DataChecks) -> None:
    """A table is cut into batches: a model whose batch axis is fixed needs exactly that many rows per batch."""
    rows = len(dataset)
    for spec in inputs:
        fixed = spec.dims[0] if spec.dims else None
        if fixed is None or spec.name not in dataset.arrays:
            continue
        for field, batch_size in checks.batch_sizes.items():
            if batch_size != fixed:
                raise QuantuneError(
                    f"{field}: {batch_size}, but model input '{spec.name}' has a fixed batch dimension of {fixed} "
                    f"({spec.describe()}); set {field}: {fixed}"
                )
        if rows % fixed:
            raise QuantuneError(
                f"{checks.field}: holds {rows} rows, not a multiple of model input '{spec.name}''s fixed batch "
                f"dimension {fixed}; the last batch would not fit"
            )
