"""Static quantization by NNCF's ONNX backend (``nncf.quantize``), a second quantizer beside onnxruntime's.

NNCF writes a QDQ model with its own choices: its hardware patterns, its ``preset``, fast bias
correction, and its ``transformer`` model type. Nodes kept in float go in its ignored scope.
The rest of the house knows it only by its traits. Needs ``pip install 'quantune[nncf]'``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import onnx
from pydantic import Field

from quantune.errors import TrialError
from quantune.passes.base import Knobs, Pass, PassConfig, PassContext
from quantune.passes.onnx.compat import quantizer_accepts
from quantune.passes.onnx.float_source import remember_float_source
from quantune.passes.registry import register_pass
from quantune.space import Boolean, Categorical


class NNCFQuantizationConfig(PassConfig):
    preset: Literal["performance", "mixed"] = "performance"
    fast_bias_correction: bool = True
    model_type: Literal["default", "transformer"] = "default"
    subset_size: int = Field(default=300, gt=0)  # calibration rows
    ignored_nodes: list[str] = []


@register_pass
class NNCFQuantization(Pass):
    """NNCF's post-training quantization of an ONNX model (QDQ, calibrated)."""

    name = "nncf_quant"
    role = "quantize"
    quantizes = "static"
    rewrites_weights = True
    needs_calibration = True
    Config = NNCFQuantizationConfig
    min_opset = 13  # per-channel DequantizeLinear
    graph_params = frozenset({"preset", "model_type", "ignored_nodes"})
    knobs = Knobs(
        exclude="ignored_nodes",
        samples="subset_size",
        calibration=("subset_size",),
        screen=("fast_bias_correction",),
        ceilings=("preset",),
        speed_class=("preset", "model_type"),
    )
    search_space = {
        "preset": Categorical(("performance", "mixed"), weights=(2, 1)),
        "fast_bias_correction": Boolean(weights=(1, 2)),
    }

    @classmethod
    def accepts(cls, config: PassConfig, upstream: list[tuple[str, PassConfig]]) -> bool:
        return quantizer_accepts(cls.name, config, upstream)

    def run(self, config: NNCFQuantizationConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        if context.calibration is None:
            raise TrialError(f"{self.name} needs calibration data: set data.calibration in the config")
        try:
            import nncf  # the extra (seconds of imports): paid only by a run that uses it
        except ImportError as exc:
            raise TrialError(f"{self.name} needs NNCF: pip install 'quantune[nncf]' ({exc})") from exc
        batches = list(context.calibration.batches(context.input_names, context.batch_size, config.subset_size))
        quantized = nncf.quantize(
            onnx.load(str(model_in)),
            nncf.Dataset(batches),
            preset=nncf.QuantizationPreset(config.preset),
            subset_size=config.subset_size,
            fast_bias_correction=config.fast_bias_correction,
            model_type=nncf.ModelType.TRANSFORMER if config.model_type == "transformer" else None,
            ignored_scope=nncf.IgnoredScope(names=list(config.ignored_nodes)) if config.ignored_nodes else None,
        )
        onnx.save(quantized, str(model_out))
        remember_float_source(model_out, model_in, context.model_sha256, context.cache_dir)  # for the refining passes
