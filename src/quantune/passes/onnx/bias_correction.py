"""Empirical bias correction of a static QDQ model's Conv/Gemm layers.

Rounding shifts a layer's outputs by, per output channel, mostly a constant: the mean of
``W_q x_q - W x`` over the data, added back to the int32 bias (Nagel et al., 2019; AIMET's
``bias_correction``). Layers are corrected in graph order, each measured with the earlier ones
corrected. Cheap, and the model keeps its graph and int8 speed.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from pydantic import Field

from quantune.errors import TrialError
from quantune.passes.base import Pass, PassConfig, PassContext
from quantune.passes.onnx.float_source import find_float_source, remember_float_source
from quantune.passes.onnx.layerwise import Calibration, channel_mean_error, session_with_outputs
from quantune.passes.onnx.qdq_layers import can_set_bias, layer_bias, quantized_layers, set_bias
from quantune.passes.registry import qdq_quantized, register_pass
from quantune.space import Categorical

log = logging.getLogger("quantune.passes")


class BiasCorrectionConfig(PassConfig):
    op_types: list[str] = ["Conv", "Gemm"]
    calibration_samples: int | None = Field(default=512, gt=0)
    # Share of the measured mean error added back (1.0: all of it).
    strength: float = Field(default=1.0, ge=0.0, le=1.0)


@register_pass
class BiasCorrection(Pass):
    """Adds each quantized Conv/Gemm's mean output error (per channel, on calibration data) to its bias."""

    name = "bias_correction"
    role = "recover"
    recover_cost = 1
    auto_place = "refine"
    rewrites_weights = True  # its output holds static_quant's quantized weights
    Config = BiasCorrectionConfig
    needs_calibration = True
    search_space = {"strength": Categorical((1.0, 0.5))}

    @classmethod
    def accepts(cls, config: PassConfig, upstream: list[tuple[str, PassConfig]]) -> bool:
        """Only after a static quantizer that wrote QDQ (the bias it rewrites is DequantizeLinear's int32)."""
        return qdq_quantized(upstream)

    def run(self, config: BiasCorrectionConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        if context.calibration is None:
            raise TrialError("bias_correction needs calibration data: set data.calibration in the config")
        float_path = find_float_source(model_in, context.cache_dir, self.name)
        model = onnx.load(str(model_in))
        calibration = Calibration(
            context.calibration, context.input_names, context.batch_size, config.calibration_samples
        )
        corrected = correct_biases(model, float_path, calibration, config)
        log.info("bias_correction: %d layer(s) corrected", corrected)
        onnx.save(model, str(model_out))
        # a later refining pass (bias_correction -> fast_finetune) finds the same float model
        remember_float_source(model_out, float_path, float_path.parent.name, context.cache_dir)


def correct_biases(
    model: onnx.ModelProto, float_path: Path, calibration: Calibration, config: BiasCorrectionConfig
) -> int:
    """Corrects ``model`` (QDQ) in place against the float model at ``float_path``; returns the count."""
    float_model = onnx.load(str(float_path), load_external_data=False)
    floats = {node.name: node for node in float_model.graph.node}
    layers = [
        layer
        for layer in quantized_layers(model, tuple(t for t in config.op_types if t in ("Conv", "Gemm")))
        if layer.name in floats and can_set_bias(model, layer)
    ]
    if not layers:
        return 0
    reference = session_with_outputs(float_path, [floats[layer.name].output[0] for layer in layers], optimize=True)
    for layer in layers:
        session = session_with_outputs(model, [layer.node.output[0]], optimize=False)
        error = channel_mean_error(
            session, layer.node.output[0], reference, floats[layer.name].output[0], calibration, layer.channel_axis
        )
        bias = layer_bias(model, layer, error.size)
        set_bias(model, layer, bias + config.strength * error.astype(np.float32))
        log.info("bias_correction: %s mean |shift| %.3g", layer.name, float(np.mean(np.abs(error))))
    return len(layers)
