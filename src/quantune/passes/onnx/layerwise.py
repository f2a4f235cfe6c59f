"""Layer by layer over calibration data: one layer's tensors at a time, within a memory budget.

The refining passes need, for each quantized layer in graph order, its input as the quantized
model so far computes it (so each layer absorbs its predecessors' error) and the float model's
output of the same layer. Only that layer's tensors are held, for as many rows as fit a quarter
of the memory budget.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from quantune.data import Dataset
from quantune.memory import memory_budget_mb

log = logging.getLogger("quantune.passes")
_MB = 1024 * 1024


def session_with_outputs(model: onnx.ModelProto | Path, names: list[str], *, optimize: bool) -> ort.InferenceSession:
    """A CPU session that also returns the intermediate tensors ``names``.

    The quantized model runs unoptimized: every DequantizeLinear output is then computed as
    the float the next layer reads (a fused int8 kernel would hide it).
    """
    if isinstance(model, Path):
        model = onnx.load(str(model))
    else:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        model = copy
    present = {out.name for out in model.graph.output}
    for name in names:
        if name not in present:
            model.graph.output.append(onnx.ValueInfoProto(name=name))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


class Calibration:
    """The calibration batches a refining pass reads (``limit`` rows at most), each time afresh."""

    def __init__(self, data: Dataset, input_names: list[str], batch_size: int, limit: int | None) -> None:
        self.data, self.input_names, self.batch_size, self.limit = data, input_names, batch_size, limit

    def batches(self) -> Iterator[dict[str, np.ndarray]]:
        yield from self.data.batches(self.input_names, self.batch_size, self.limit)


def paired_tensors(
    quantized: ort.InferenceSession,
    quantized_name: str,
    reference: ort.InferenceSession,
    reference_name: str,
    calibration: Calibration,
    budget_mb: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The two tensors over the calibration batches, stacked until a quarter of the budget is filled."""
    limit = (memory_budget_mb() if budget_mb is None else budget_mb) * _MB / 4
    left: list[np.ndarray] = []
    right: list[np.ndarray] = []
    held = 0.0
    for batch in calibration.batches():
        (a,) = quantized.run([quantized_name], batch)
        (b,) = reference.run([reference_name], batch)
        if left and (held + a.nbytes + b.nbytes > limit or a.shape[1:] != left[0].shape[1:]):
            log.info(
                "layerwise: %s: %d calibration batches fit the memory budget; using those", quantized_name, len(left)
            )
            break
        left.append(np.asarray(a, np.float32))
        right.append(np.asarray(b, np.float32))
        held += a.nbytes + b.nbytes
    return np.concatenate(left), np.concatenate(right)


def channel_mean_error(
    quantized: ort.InferenceSession,
    quantized_name: str,
    reference: ort.InferenceSession,
    reference_name: str,
    calibration: Calibration,
    channel_axis: int,
) -> np.ndarray:
    """Mean of (float output - quantized output) per output channel, streamed over the data."""
    total: np.ndarray | None = None
    count = 0
    for batch in calibration.batches():
        (a,) = quantized.run([quantized_name], batch)
        (b,) = reference.run([reference_name], batch)
        diff = np.moveaxis(np.asarray(b, np.float64) - np.asarray(a, np.float64), channel_axis, -1)
        flat = diff.reshape(-1, diff.shape[-1])
        total = flat.sum(axis=0) if total is None else total + flat.sum(axis=0)
        count += flat.shape[0]
    assert total is not None, "no calibration data"
    return total / max(count, 1)
