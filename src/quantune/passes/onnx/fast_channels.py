"""onnxruntime's per-channel weight quantization, computed for all channels at once.

onnxruntime's quantizer quantizes a per-channel weight one channel at a time in Python
(``BaseQuantizer.quantize_weight_per_channel_impl`` calls ``quantize_data`` per channel):
8,210 calls for the captcha model's output MatMul, 10,371 for MiniLM-L3's 18 MatMuls -- 1.0 s
and 1.8 s of each dynamic build, on the path to the first model in budget. The arithmetic is
per channel and elementwise, so it vectorizes exactly: the same float64 range, the same
float32 scale, the same rounding. :func:`fast_per_channel` swaps the vectorized version in
for the duration of a quantizer call, only where it gives byte-identical results: it is
checked against onnxruntime's own function on a probe weight for each type, symmetry and
range it is asked for (an onnxruntime whose arithmetic differs keeps its own function), and
a weight with per-channel overrides always goes to onnxruntime's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

log = logging.getLogger("quantune.passes")

_LOCK = threading.Lock()
_VERIFIED: dict[tuple[int, bool, bool], bool] = {}
_TYPES = {onnx.TensorProto.INT8: np.int8, onnx.TensorProto.UINT8: np.uint8}
_PLAIN_OVERRIDE = {"axis"}  # an override holding only the axis changes nothing


def quantize_channels(
    weights: np.ndarray, q_type: int, axis: int, symmetric: bool, reduce_range: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(quantized weights, zero points, scales) per slice along ``axis``, as onnxruntime computes them."""
    from onnxruntime.quantization.quant_utils import get_qmin_qmax_for_qType

    qmin, qmax = get_qmin_qmax_for_qType(q_type, reduce_range, symmetric=symmetric)
    low, high = get_qmin_qmax_for_qType(q_type, reduce_range=False, symmetric=False)
    data = np.moveaxis(np.asarray(weights), axis, 0).reshape(weights.shape[axis], -1)
    rmin = np.minimum(data.min(axis=1), np.array(0, dtype=data.dtype))
    rmax = np.maximum(data.max(axis=1), np.array(0, dtype=data.dtype))
    if symmetric:
        absmax = np.maximum(np.abs(rmin), np.abs(rmax))
        rmin, rmax = -absmax, absmax
    scale64 = (rmax.astype(np.float64) - rmin.astype(np.float64)) / (float(qmax) - float(qmin))
    tiny = scale64 < np.finfo(rmax.dtype).tiny
    scale = np.where(tiny, 1.0, scale64).astype(rmax.dtype)
    if symmetric:
        zero = np.full(len(data), np.round((qmin + qmax) / np.float64(2.0)))
    else:
        zero = np.round(qmin - rmin / np.where(tiny, 1.0, scale64))
    zero = np.where(tiny, 0, zero).astype(_TYPES[q_type])
    shape = [1] * weights.ndim
    shape[axis] = -1
    scaled = (np.asarray(weights).astype(np.float32) / scale.reshape(shape)).round() + zero.reshape(shape)
    quantized = np.clip(scaled, low, high).astype(_TYPES[q_type])
    return quantized, zero, scale


def _impl(original: Any) -> Any:
    def quantize_weight_per_channel_impl(
        self: Any,
        weight_name: str,
        weight_qType: int,
        channel_axis: int,
        reduce_range: bool = True,
        keep_float_weight: bool = False,
    ) -> Any:
        from onnxruntime.quantization.quant_utils import TENSOR_NAME_QUANT_SUFFIX, find_by_name

        overrides = self.tensor_quant_overrides.get_per_channel_overrides(
            weight_name, default_val=[{"axis": channel_axis}]
        )
        initializer = find_by_name(weight_name, self.model.initializer())
        symmetric = self.is_weight_symmetric(weight_qType)
        reduce = bool(self.reduce_range and reduce_range)
        plain = len(overrides) == 1 and set(overrides[0]) <= _PLAIN_OVERRIDE and not keep_float_weight
        if initializer is None or not plain or not _verified(original, self, weight_qType, symmetric, reduce):
            return original(self, weight_name, weight_qType, channel_axis, reduce_range, keep_float_weight)
        weights = numpy_helper.to_array(initializer)
        axis = channel_axis % weights.ndim
        if overrides[0].get("axis", axis) % weights.ndim != axis or getattr(self, "min_real_range", None):
            return original(self, weight_name, weight_qType, channel_axis, reduce_range, keep_float_weight)
        quantized, zero, scale = quantize_channels(weights, weight_qType, axis, symmetric, reduce)
        q_name, zp_name, scale_name = (
            weight_name + TENSOR_NAME_QUANT_SUFFIX,
            weight_name + "_zero_point",
            weight_name + "_scale",
        )
        dims = [initializer.dims[axis]]
        self.model.initializer_extend(
            [
                onnx.helper.make_tensor(scale_name, initializer.data_type, dims, scale.tolist()),
                onnx.helper.make_tensor(zp_name, weight_qType, dims, zero.tolist()),
                numpy_helper.from_array(quantized.reshape(initializer.dims), q_name),
            ]
        )
        return q_name, zp_name, scale_name

    return quantize_weight_per_channel_impl


def _verified(original: Any, quantizer: Any, q_type: int, symmetric: bool, reduce: bool) -> bool:
    """Whether the vectorized version gives onnxruntime's very bytes for this case (checked once)."""
    key = (q_type, symmetric, reduce)
    if key not in _VERIFIED:
        _VERIFIED[key] = q_type in _TYPES and _same_as_onnxruntime(original, quantizer, q_type, reduce)
        if not _VERIFIED[key]:
            log.debug("per-channel quantization of %s: onnxruntime's own (the vectorized one differs)", key)
    return _VERIFIED[key]


def _same_as_onnxruntime(original: Any, quantizer: Any, q_type: int, reduce: bool) -> bool:
    rng = np.random.default_rng(0)
    probe = rng.normal(0, 0.2, (7, 5, 3)).astype(np.float32)
    probe[1] = np.abs(probe[1])  # a channel without negatives
    probe[2] = 0.0  # an all-zero channel
    probe[3] *= 1e-3
    name = "__quantune_probe__"
    model = quantizer.model
    saved = list(model.initializer())
    try:
        model.initializer_extend([numpy_helper.from_array(probe, name)])
        theirs = original(quantizer, name, q_type, 1, reduce)
        reference = {init.name: numpy_helper.to_array(init) for init in model.initializer() if init.name in theirs}
    except Exception:
        return False
    finally:
        del model.model.graph.initializer[:]
        model.model.graph.initializer.extend(saved)
    quantized, zero, scale = quantize_channels(probe, q_type, 1, quantizer.is_weight_symmetric(q_type), reduce)
    q_name, zp_name, scale_name = theirs
    return (
        np.array_equal(reference[q_name], quantized)
        and np.array_equal(reference[zp_name], zero)
        and np.array_equal(reference[scale_name], scale)
        and reference[scale_name].dtype == scale.dtype
    )


@contextlib.contextmanager
def fast_per_channel() -> Iterator[None]:
    """onnxruntime's quantizers use :func:`quantize_channels` for plain per-channel weights meanwhile."""
    from onnxruntime.quantization.base_quantizer import BaseQuantizer

    with _LOCK:
        original = BaseQuantizer.quantize_weight_per_channel_impl
        BaseQuantizer.quantize_weight_per_channel_impl = _impl(original)
        try:
            yield
        finally:
            BaseQuantizer.quantize_weight_per_channel_impl = original
