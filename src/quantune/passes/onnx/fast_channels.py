"""onnxruntime's per-channel weight quantization, computed for all channels at once.

onnxruntime's quantizers quantize a per-channel weight one channel at a time in Python (the
dynamic/QOperator quantizer's loop, and the QDQ quantizer's scales and values): thousands of
calls for a wide output layer. The arithmetic is elementwise, so it vectorizes exactly.
:func:`fast_per_channel` swaps the vectorized versions in for a quantizer call, only where each
is checked byte-identical to onnxruntime's own on a probe weight (else onnxruntime's stays), and
never for a weight with per-channel overrides.
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
_VERIFIED: dict[tuple[Any, ...], bool] = {}
_TYPES = {onnx.TensorProto.INT8: np.int8, onnx.TensorProto.UINT8: np.uint8}
_PLAIN_OVERRIDE = {"axis"}  # an override holding only the axis changes nothing


def quantize_channels(
    weights: np.ndarray, q_type: int, axis: int, symmetric: bool, reduce_range: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(quantized weights, zero points, scales) per slice along ``axis``, as onnxruntime computes them."""
    zero, scale = channel_params(weights, q_type, axis, symmetric, reduce_range)
    return quantize_with(weights, zero, scale, axis, q_type), zero, scale


def quantize_with(weights: np.ndarray, zero: np.ndarray, scale: np.ndarray, axis: int, q_type: int) -> np.ndarray:
    """``weights`` quantized with one (zero point, scale) per slice along ``axis``, as ``quantize_nparray`` does."""
    from onnxruntime.quantization.quant_utils import get_qmin_qmax_for_qType

    low, high = get_qmin_qmax_for_qType(q_type, reduce_range=False, symmetric=False)
    shape = [1] * weights.ndim
    shape[axis] = -1
    scaled = (np.asarray(weights).astype(np.float32) / scale.reshape(shape)).round() + zero.reshape(shape)
    return np.clip(scaled, low, high).astype(_TYPES[q_type])


def channel_params(
    weights: np.ndarray, q_type: int, axis: int, symmetric: bool, reduce_range: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(zero points, scales) per slice along ``axis``: ``compute_data_quant_params`` on each slice."""
    from onnxruntime.quantization.quant_utils import get_qmin_qmax_for_qType

    qmin, qmax = get_qmin_qmax_for_qType(q_type, reduce_range, symmetric=symmetric)
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
    return zero, scale


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


def _qdq_params_impl(original: Any) -> Any:
    def _calc_initializer_quant_params(self: Any) -> dict[str, Any]:
        """onnxruntime's, with the plain per-channel initializers' scales computed here (hidden from it)."""
        from onnxruntime.quantization.base_quantizer import QuantizationParams
        from onnxruntime.quantization.qdq_quantizer import QDQQuantTensorType

        fast: dict[str, Any] = {}
        if not getattr(self, "block_size", 0) and getattr(self, "min_real_range", None) is None:
            inits = {init.name: init for init in self.model.initializer()}
            for name, info in self.tensors_to_quantize.items():
                init = inits.get(name)
                if init is None or info.axis is None or init.data_type != onnx.TensorProto.FLOAT:
                    continue
                if self.tensor_quant_overrides.get(name, None):  # the user's (or a unit's) overrides
                    continue
                weight = info.tensor_type is QDQQuantTensorType.WEIGHT
                q_type = self.weight_qType if weight else self.activation_qType
                rank = len(init.dims)
                if not -rank <= info.axis < rank or not _params_verified(q_type, self):
                    continue
                data = numpy_helper.to_array(init)
                axis = info.axis % data.ndim
                zero, scale = channel_params(data, q_type, axis, True, bool(self.reduce_range))  # symmetric
                fast[name] = QuantizationParams(zero_point=zero, scale=scale, quant_type=q_type, axis=axis)
        if not fast:
            return original(self)
        every = self.tensors_to_quantize
        self.tensors_to_quantize = {name: info for name, info in every.items() if name not in fast}
        try:
            theirs = original(self)
        finally:
            self.tensors_to_quantize = every
        return {name: fast.get(name) or theirs[name] for name in every if name in fast or name in theirs}

    return _calc_initializer_quant_params


def _params_verified(q_type: int, quantizer: Any) -> bool:
    """Whether :func:`channel_params` gives ``compute_data_quant_params``'s very values per channel."""
    key = ("params", q_type, bool(quantizer.reduce_range))
    if key not in _VERIFIED:
        from onnxruntime.quantization.quant_utils import compute_data_quant_params

        probe = _probe()
        ok = q_type in _TYPES
        if ok:
            zero, scale = channel_params(probe, q_type, 1, True, bool(quantizer.reduce_range))
            for i in range(probe.shape[1]):
                z, s = compute_data_quant_params(probe.take(i, 1).ravel(), q_type, True, bool(quantizer.reduce_range))
                ok = ok and z.dtype == zero.dtype and s.dtype == scale.dtype and z == zero[i] and s == scale[i]
        _VERIFIED[key] = bool(ok)
    return _VERIFIED[key]


def _initializer_impl(original: Any) -> Any:
    def quantize_onnx_initializer(
        weight: Any,
        quant_type: int,
        zero_point: np.ndarray,
        scale: np.ndarray,
        axis: int | None = None,
        quant_weight_name: str | None = None,
        block_size: int = 0,
    ) -> Any:
        """onnxruntime's, every channel at once for a plain per-channel 8-bit weight."""
        from onnxruntime.quantization.quant_utils import TENSOR_NAME_QUANT_SUFFIX

        plain = axis is not None and not block_size and weight.data_type == onnx.TensorProto.FLOAT
        if not plain or not _initializer_verified(original, quant_type):
            return original(weight, quant_type, zero_point, scale, axis, quant_weight_name, block_size)
        data = numpy_helper.to_array(weight)
        quantized = quantize_with(data, np.asarray(zero_point), np.asarray(scale), axis % data.ndim, quant_type)
        name = quant_weight_name if quant_weight_name else f"{weight.name}{TENSOR_NAME_QUANT_SUFFIX}"
        return numpy_helper.from_array(quantized.reshape(tuple(weight.dims)), name)

    return quantize_onnx_initializer


def _initializer_verified(original: Any, q_type: int) -> bool:
    """Whether the vectorized quantization gives ``quantize_onnx_initializer``'s very bytes."""
    key = ("initializer", q_type)
    if key not in _VERIFIED:
        ok = q_type in _TYPES
        if ok:
            probe = _probe()
            zero, scale = channel_params(probe, q_type, 1, True, False)
            tensor = numpy_helper.from_array(probe, "probe")
            try:
                theirs = original(tensor, q_type, zero, scale, 1)
            except Exception:
                ok = False
            else:
                ours = numpy_helper.from_array(quantize_with(probe, zero, scale, 1, q_type), theirs.name)
                ok = ours.SerializeToString() == theirs.SerializeToString()
        _VERIFIED[key] = ok
    return _VERIFIED[key]


def _probe() -> np.ndarray:
    rng = np.random.default_rng(0)
    probe = rng.normal(0, 0.2, (7, 5, 3)).astype(np.float32)
    probe[:, 1] = np.abs(probe[:, 1])  # a channel without negatives
    probe[:, 2] = 0.0  # an all-zero channel
    probe[:, 3] *= 1e-3
    return probe


@contextlib.contextmanager
def fast_per_channel() -> Iterator[None]:
    """onnxruntime's quantizers use :func:`channel_params` and :func:`quantize_with` meanwhile."""
    from onnxruntime.quantization import qdq_quantizer
    from onnxruntime.quantization.base_quantizer import BaseQuantizer

    with _LOCK:
        original = BaseQuantizer.quantize_weight_per_channel_impl
        params = qdq_quantizer.QDQQuantizer._calc_initializer_quant_params
        initializer = qdq_quantizer.quantize_onnx_initializer
        BaseQuantizer.quantize_weight_per_channel_impl = _impl(original)
        qdq_quantizer.QDQQuantizer._calc_initializer_quant_params = _qdq_params_impl(params)
        qdq_quantizer.quantize_onnx_initializer = _initializer_impl(initializer)
        try:
            yield
        finally:
            BaseQuantizer.quantize_weight_per_channel_impl = original
            qdq_quantizer.QDQQuantizer._calc_initializer_quant_params = params
            qdq_quantizer.quantize_onnx_initializer = initializer
