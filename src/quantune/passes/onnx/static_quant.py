"""onnxruntime static quantization with calibration, over its whole option surface.

The default search covers the choices that decide speed on a CPU (S8S8 can be slower than fp32
where U8S8 is faster); combinations onnxruntime cannot run fail validation and are never run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import onnx
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.calibrate import save_tensors_data
from pydantic import Field, model_validator

from quantune.data import CalibrationReader
from quantune.errors import TrialError
from quantune.machine import is_x86
from quantune.passes.base import Knobs, Pass, PassConfig, PassContext
from quantune.passes.onnx.calibration import calibrate_ranges
from quantune.passes.onnx.calibration_options import (
    calibration_key,
    calibration_options,
    check_calibration_options,
    model_options,
)
from quantune.passes.onnx.compat import quantizer_accepts
from quantune.passes.onnx.fast_channels import fast_per_channel
from quantune.passes.onnx.fast_lookups import fast_lookups
from quantune.passes.onnx.fast_shapes import fits_in_memory, in_memory_shapes
from quantune.passes.onnx.float_fallback import keep_excluded_float
from quantune.passes.onnx.float_source import remember_float_source
from quantune.passes.onnx.tensor_names import inference_error, plain_names, renamed_ranges, restore_names
from quantune.passes.onnx.unit_overrides import per_channel_overrides
from quantune.passes.registry import facts_apply, register_pass
from quantune.prepare.facts import quantized_among
from quantune.space import Boolean, Categorical, Conditional
from quantune.store.cache import cache_key

CPU_PROVIDER = "CPUExecutionProvider"

log = logging.getLogger("quantune.passes")

QuantTypeName = Literal["int8", "uint8", "int16", "uint16"]
QUANT_TYPES = {
    "int8": QuantType.QInt8,
    "uint8": QuantType.QUInt8,
    "int16": QuantType.QInt16,
    "uint16": QuantType.QUInt16,
}
_WIDE = {"int16", "uint16"}
# quantize_static's extra_options that configure its calibrator, and the calibrator's names for them.
_CALIB_OPTIONS = (
    ("CalibTensorRangeSymmetric", "symmetric"),
    ("CalibMovingAverage", "moving_average"),
    ("CalibMovingAverageConstant", "averaging_constant"),
    ("CalibPercentile", "percentile"),
)


class StaticQuantizationConfig(PassConfig):
    quant_format: Literal["QDQ", "QOperator"] = "QDQ"
    calibrate_method: Literal["MinMax", "Entropy", "Percentile", "Distribution"] = "MinMax"
    per_channel: bool = False
    reduce_range: bool = False
    activation_type: QuantTypeName = "uint8"
    weight_type: QuantTypeName = "int8"
    activation_symmetric: bool = False
    weight_symmetric: bool = True
    calibration_samples: int | None = Field(default=None, gt=0)
    percentile: float = Field(default=99.999, gt=0, le=100)
    op_types_to_quantize: list[str] | None = None
    nodes_to_exclude: list[str] = []
    # Per-tensor activation type (tensor name -> type), e.g. int16 for the activations of the
    # few operators 8 bits cannot carry; onnxruntime's ``TensorQuantOverrides`` (QDQ only).
    tensor_overrides: dict[str, QuantTypeName] = {}
    # Nodes whose weights are quantized per channel although ``per_channel`` is off (QDQ only):
    # the quantune strategy's targeted recovery of the worst units (unit_overrides.py).
    per_channel_nodes: list[str] = []
    # onnxruntime's calibration knobs (quantize_static extra_options, see calibration_options.py)
    calib_moving_average: bool = False  # CalibMovingAverage (MinMax)
    calib_moving_average_constant: float = Field(default=0.01, ge=0.0, le=1.0)  # CalibMovingAverageConstant
    calib_strided_minmax: int | None = Field(default=None, gt=0)  # CalibStridedMinMax (batches per stride)
    calib_tensor_range_symmetric: bool = False  # CalibTensorRangeSymmetric
    # ... and the extra_options that change the model written
    keep_removable_activations: bool = False  # QDQKeepRemovableActivations
    add_qdq_pair_to_weight: bool = False  # AddQDQPairToWeight
    dedicated_qdq_pair: bool = False  # DedicatedQDQPair
    quantize_bias: bool = True  # QuantizeBias
    activation_restricted_asymmetric: bool = False  # ActivationRestrictedAsymmetric
    force_quantize_no_input_check: bool = False  # ForceQuantizeNoInputCheck
    matmul_const_b_only: bool = False  # MatMulConstBOnly
    minimum_real_range: float | None = Field(default=None, gt=0)  # MinimumRealRange

    @model_validator(mode="after")
    def _supported(self) -> StaticQuantizationConfig:
        wide = self.wide_types()
        if wide and self.quant_format != "QDQ":
            raise ValueError(f"{sorted(wide)} types need quant_format 'QDQ' (QOperator has only 8-bit kernels)")
        if self.per_channel_nodes and self.quant_format != "QDQ":
            raise ValueError("per_channel_nodes needs quant_format 'QDQ' (a TensorQuantOverrides axis)")
        check_calibration_options(self)
        return self

    def wide_types(self) -> set[str]:
        """The 16-bit types this config uses anywhere (model-wide or in a tensor override)."""
        return ({self.activation_type, self.weight_type} | set(self.tensor_overrides.values())) & _WIDE


@register_pass
class StaticQuantization(Pass):
    """Calibrates activation ranges on calibration data, then quantizes weights and activations."""

    name = "static_quant"
    role = "quantize"
    quantizes = "static"
    leaves_quantized = frozenset({"QLinearConv", "QLinearMatMul", "QGemm", "QAttention"})
    rewrites_weights = True
    auto_place = "quantize"
    version = 4
    Config = StaticQuantizationConfig
    needs_calibration = True
    limits = "never follows graph_opt at level 'extended' or 'all', and per-channel QDQ needs opset 13"
    # The rest (calibrate_method, percentile, reduce_range, ...) only move scales and zero points.
    graph_params = frozenset(
        {
            "quant_format",
            "activation_type",
            "weight_type",
            "per_channel",
            "activation_symmetric",
            "op_types_to_quantize",
            "nodes_to_exclude",
            "tensor_overrides",
            "per_channel_nodes",
            "keep_removable_activations",
            "add_qdq_pair_to_weight",
            "dedicated_qdq_pair",
            "quantize_bias",
            "matmul_const_b_only",
            "force_quantize_no_input_check",
        }
    )
    knobs = Knobs(
        exclude="nodes_to_exclude",
        overrides="tensor_overrides",
        op_types="op_types_to_quantize",
        layout="quant_format",
        qdq="QDQ",
        weights="weight_type",
        per_channel="per_channel",
        narrow="reduce_range",
        channel_nodes="per_channel_nodes",
        samples="calibration_samples",
        calibration=("calibrate_method", "percentile", "calibration_samples"),
        screen=("per_channel", "calibrate_method", "activation_symmetric", "reduce_range"),
        ceilings=("activation_type", "quant_format"),
        speed_class=("quant_format", "activation_type", "activation_symmetric"),
        built_last={"activation_type": "int8"},  # slow where the CPU's int8 dot products saturate
    )
    # Accelerator EPs take QDQ graphs only; TensorRT wants symmetric int8 activations.
    provider_rules = {
        "TensorrtExecutionProvider": {
            "quant_format": ("QDQ",),
            "activation_type": ("int8",),
            "weight_type": ("int8",),
            "activation_symmetric": (True,),
        },
        "CUDAExecutionProvider": {"quant_format": ("QDQ",)},
        "QNNExecutionProvider": {"quant_format": ("QDQ",)},
        "OpenVINOExecutionProvider": {"quant_format": ("QDQ",)},
    }
    # Priors: QDQ and uint8 activations are usually the fast ones on a CPU; per-channel weights
    # cost nothing and hold accuracy.
    search_space = {
        "quant_format": Categorical(("QDQ", "QOperator"), weights=(2, 1)),
        "calibrate_method": Categorical(("MinMax", "Entropy", "Percentile"), weights=(2, 1, 1)),
        "percentile": Conditional.on("calibrate_method", {"Percentile": (99.99, 99.999)}),
        "activation_type": Categorical(("uint8", "int8"), weights=(3, 1)),
        "activation_symmetric": Conditional.on("activation_type", {"int8": (False, True)}),
        "per_channel": Boolean(weights=(1, 2)),
        "reduce_range": Boolean(weights=(2, 1)),
    }
    # The calibration knobs are not searched by default: they rarely change accuracy, and on one
    # calibration batch the moving average gives plain MinMax's model (a duplicate trial).
    min_opset = 13  # per-channel QDQ writes DequantizeLinear with an axis

    @classmethod
    def faster_twin(
        cls, config: Mapping[str, Any], provider: str, op_types: frozenset[str]
    ) -> tuple[dict[str, Any], str] | None:
        """S8S8 QOperator on x86 is slow (onnxruntime's docs); the QDQ model has the same scales."""
        s8s8 = config.get("activation_type") == "int8" and config.get("weight_type", "int8") == "int8"
        if provider == CPU_PROVIDER and is_x86() and config.get("quant_format") == "QOperator" and s8s8:
            return {"quant_format": "QDQ"}, "onnxruntime runs S8S8 QOperator models slowly on x86 (its docs)"
        return None

    @classmethod
    def supports(cls, config: PassConfig, facts: Mapping[str, Any], upstream: list[tuple[str, PassConfig]]) -> bool:
        """Per-channel QDQ needs opset 13; QOperator needs the weights and biases it quantizes as initializers."""
        assert isinstance(config, StaticQuantizationConfig)
        if config.quant_format == "QDQ" and config.per_channel and facts.get("opset", 13) < 13:
            return False
        if config.quant_format == "QOperator" and facts_apply(facts, upstream):
            computed = [*facts.get("computed_weights", ()), *facts.get("computed_biases", ())]
            if quantized_among(computed, config.op_types_to_quantize, config.nodes_to_exclude):
                return False
        return True

    @classmethod
    def accepts(cls, config: PassConfig, upstream: list[tuple[str, PassConfig]]) -> bool:
        """Not after graph_opt 'extended' or 'all': their fused ops have no inferred types to calibrate."""
        if not quantizer_accepts(cls.name, config, upstream):
            return False
        return not any(name == "graph_opt" and getattr(c, "level", None) in ("extended", "all") for name, c in upstream)

    def run(self, config: StaticQuantizationConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        if context.calibration is None:
            raise TrialError("static_quant needs calibration data: set data.calibration in the config")
        calibration = context.calibration

        def reader() -> CalibrationReader:  # a fresh pass over the calibration data
            return CalibrationReader(calibration, context.input_names, context.batch_size, config.calibration_samples)

        extra: dict[str, object] = {
            "ActivationSymmetric": config.activation_symmetric,
            "WeightSymmetric": config.weight_symmetric,
            "CalibPercentile": config.percentile,
            "DefaultTensorType": onnx.TensorProto.FLOAT,  # fused ops after graph_opt have no inferred types
        }
        if config.wide_types():
            extra["UseQDQContribOps"] = True
        extra.update(model_options(config))
        extra.update(calibration_options(config))
        if config.tensor_overrides:
            extra["TensorQuantOverrides"] = {
                name: [{"quant_type": QUANT_TYPES[kind]}] for name, kind in sorted(config.tensor_overrides.items())
            }
        if config.per_channel_nodes and not config.per_channel:
            weights = per_channel_overrides(model_in, config.per_channel_nodes)
            if weights:
                extra["TensorQuantOverrides"] = {**dict(extra.get("TensorQuantOverrides") or {}), **weights}
        ranges, fresh = self._calibration_cache(config, context)
        shapes = in_memory_shapes() if fits_in_memory(model_in) else contextlib.nullcontext()
        with shapes, tempfile.TemporaryDirectory(prefix="quantune-ranges-") as tmp:
            source = ranges if ranges is not None and fresh is None else None  # a cache hit
            if source is None:  # calibrate here, in chunks of bounded memory
                source = fresh or Path(tmp) / "ranges.json"
                options = {key: extra[name] for name, key in _CALIB_OPTIONS if name in extra}
                computed = calibrate_ranges(
                    model_in,
                    reader,
                    CalibrationMethod[config.calibrate_method],
                    op_types=config.op_types_to_quantize,
                    options=options,
                    stride=config.calib_strided_minmax,
                )
                save_tensors_data(computed, source)
                if fresh is not None and ranges is not None:  # published whole (os.replace) before quantizing:
                    os.replace(fresh, ranges)  # a build in the other worker with the same ranges reads them now
                    source = ranges
            self._quantize(config, model_in, model_out, extra, source)
            if inference_error(model_out) is not None:  # the quantizer tripped on the model's names
                self._quantize_plain(config, model_in, model_out, extra, source, Path(tmp))
        remember_float_source(model_out, model_in, context.model_sha256, context.cache_dir)

    @staticmethod
    def _quantize(config: StaticQuantizationConfig, model_in: Path, model_out: Path, extra: dict, ranges: Path) -> None:
        """onnxruntime's quantize_static from ranges already computed (never its own calibration)."""
        with fast_per_channel(), fast_lookups():
            quantize_static(
                str(model_in),
                str(model_out),
                None,
                quant_format=QuantFormat[config.quant_format],
                op_types_to_quantize=config.op_types_to_quantize,
                per_channel=config.per_channel,
                reduce_range=config.reduce_range,
                activation_type=QUANT_TYPES[config.activation_type],
                weight_type=QUANT_TYPES[config.weight_type],
                nodes_to_exclude=list(config.nodes_to_exclude),
                calibrate_method=CalibrationMethod[config.calibrate_method],
                extra_options=extra,
                calibration_cache_path=str(ranges),
            )
        if config.nodes_to_exclude:  # excluded weighted nodes stay float when onnxruntime loads the model
            model = onnx.load(str(model_out), load_external_data=False)
            if keep_excluded_float(model, list(config.nodes_to_exclude)):
                onnx.save(model, str(model_out))

    @classmethod
    def _quantize_plain(
        cls, config: StaticQuantizationConfig, model_in: Path, model_out: Path, extra: dict, ranges: Path, tmp: Path
    ) -> None:
        """The model quantized again from a copy with plain tensor names; kept when onnx accepts it."""
        model = onnx.load(str(model_in))
        names = plain_names(model)
        if names is None:
            return
        plain_in, plain_out, plain_ranges = tmp / "plain.onnx", tmp / "plain_q.onnx", tmp / "plain_ranges.json"
        onnx.save(model, str(plain_in))
        renamed_ranges(ranges, plain_ranges, names)
        overrides = extra.get("TensorQuantOverrides")
        if isinstance(overrides, dict):
            extra = {**extra, "TensorQuantOverrides": {names.get(k, k): v for k, v in overrides.items()}}
        cls._quantize(config, plain_in, plain_out, extra, plain_ranges)
        if inference_error(plain_out) is not None:
            return
        quantized = onnx.load(str(plain_out))
        restore_names(quantized, names)
        onnx.save(quantized, str(model_out))
        log.info("static_quant: quantized with plain tensor names (onnxruntime's quantizer broke the model's own)")

    @staticmethod
    def _calibration_cache(config: StaticQuantizationConfig, context: PassContext) -> tuple[Path | None, Path | None]:
        """(cache path, temporary path to write when it does not exist yet) of the activation ranges.

        Ranges do not depend on format, types or symmetry, so trials differing only there share them.
        """
        if context.cache_dir is None or context.calibration is None or not context.model_sha256:
            return None, None
        key = cache_key(
            "calibration",
            "chunked",
            context.model_sha256,
            context.calibration.fingerprint,
            context.batch_size,
            config.calibration_samples,
            config.calibrate_method,
            config.percentile if config.calibrate_method == "Percentile" else None,
            sorted(config.op_types_to_quantize or []),
            bool(config.wide_types()),
            *calibration_key(config),  # empty at the defaults: older cache entries still match
        )
        context.cache_dir.mkdir(parents=True, exist_ok=True)
        path = context.cache_dir / f"{key}.json"
        if path.is_file():
            return path, None
        return path, context.cache_dir / f".{key}.{uuid.uuid4().hex}.json"
