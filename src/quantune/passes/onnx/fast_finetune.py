"""Fast fine-tuning of a static QDQ model's weights: AdaRound or AdaQuant, layer by layer.

Round-to-nearest is not the best rounding for a layer's output, and a layer can absorb the
error of its quantized input too (Quark's FastFinetune, AIMET's AdaRound). After ``static_quant``
(QDQ), each quantized Conv/Gemm/MatMul is fitted in graph order to the float model's output of
the same layer (:mod:`.float_source`); scales and graph stay, so the model keeps its int8 speed,
and a layer whose fit does not lower its error keeps its rounding.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
from onnx import numpy_helper
from pydantic import Field
from threadpoolctl import threadpool_limits

from quantune.errors import TrialError
from quantune.passes.base import Pass, PassConfig, PassContext
from quantune.passes.onnx.float_source import find_float_source, remember_float_source
from quantune.passes.onnx.layerwise import Calibration, paired_tensors, session_with_outputs
from quantune.passes.onnx.qdq_layers import (
    LAYER_TYPES,
    QuantLayer,
    can_set_bias,
    integer_weight,
    layer_bias,
    quantized_layers,
    set_bias,
    set_integer_weight,
)
from quantune.passes.onnx.rounding import ConvOp, DenseOp, LayerOp, Quantizer, adaquant, adaround, layer_error
from quantune.passes.registry import qdq_quantized, register_pass
from quantune.space import Categorical, Joint

log = logging.getLogger("quantune.passes")


class FastFinetuneConfig(PassConfig):
    optim: Literal["adaround", "adaquant"] = "adaround"
    # With ``search: true`` these two are searched together (``<step>.num_iter_lr``, Quark's NumIterLR);
    # search ``learning_rate`` alone with ``{search: {float: [0.001, 0.1], log: true}}``.
    iterations: int = Field(default=500, gt=0, le=100_000)
    learning_rate: float = Field(default=0.01, gt=0, le=1.0)
    op_types: list[Literal["Conv", "Gemm", "MatMul"]] = list(LAYER_TYPES)
    # Only these layers (node names) are fitted, when given: the quantune strategy's targeted recovery
    # of the worst units (the other layers keep static_quant's rounding).
    nodes: list[str] | None = None
    calibration_samples: int | None = Field(default=256, gt=0)
    seed: int = 0


def _relu_after(model: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    """Whether the float layer's only consumer is a ReLU (then the fit is on the ReLU's output)."""
    consumers = [n for n in model.graph.node if node.output[0] in n.input]
    return len(consumers) == 1 and consumers[0].op_type == "Relu"


def layer_op(
    layer: QuantLayer, weight_shape: tuple[int, ...], x: np.ndarray, target: np.ndarray, relu: bool
) -> LayerOp:
    if layer.node.op_type == "Conv":
        return ConvOp(x, target, relu, layer.attrs, tuple(weight_shape[2:]))
    transposed = layer.node.op_type == "Gemm" and bool(layer.attrs.get("transB", 0))
    return DenseOp(x, target, relu, transposed)


@register_pass
class FastFinetune(Pass):
    """AdaRound / AdaQuant of a static QDQ model's Conv/Gemm/MatMul weights against the float layers."""

    name = "fast_finetune"
    role = "recover"
    recover_cost = 2
    auto_place = "refine"
    rewrites_weights = True  # its output holds static_quant's quantized weights
    Config = FastFinetuneConfig
    needs_calibration = True
    search_space = {
        "optim": Categorical(("adaround", "adaquant"), weights=(2, 1)),
        # heavier first: the longer schedule is the one that recovers most
        "num_iter_lr": Joint(("iterations", "learning_rate"), [(1000, 0.01), (300, 0.03), (1000, 0.003)]),
    }

    @classmethod
    def accepts(cls, config: PassConfig, upstream: list[tuple[str, PassConfig]]) -> bool:
        """Only after a static quantizer that wrote QDQ (its weights are integer initializers behind DequantizeLinear)."""
        return qdq_quantized(upstream)

    def run(self, config: FastFinetuneConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        if context.calibration is None:
            raise TrialError("fast_finetune needs calibration data: set data.calibration in the config")
        float_path = find_float_source(model_in, context.cache_dir, self.name)
        float_model = onnx.load(str(float_path))
        model = onnx.load(str(model_in))
        calibration = Calibration(
            context.calibration, context.input_names, context.batch_size, config.calibration_samples
        )
        with threadpool_limits(limits=1, user_api="blas"):  # BLAS threads on a shared CPU run far slower
            fitted = finetune(model, float_model, float_path, calibration, config)
        log.info("fast_finetune (%s): %d layer(s) refined", config.optim, fitted)
        onnx.save(model, str(model_out))
        # a later refining pass (bias_correction -> fast_finetune) finds the same float model
        remember_float_source(model_out, float_path, float_path.parent.name, context.cache_dir)


def finetune(
    model: onnx.ModelProto,
    float_model: onnx.ModelProto,
    float_path: Path,
    calibration: Calibration,
    config: FastFinetuneConfig,
) -> int:
    """Refines ``model`` (QDQ) in place against ``float_model``; returns how many layers changed."""
    iterations, rate = config.iterations, config.learning_rate
    floats = {node.name: node for node in float_model.graph.node}
    float_inits = {init.name: init for init in float_model.graph.initializer}
    layers = [
        layer
        for layer in quantized_layers(model, tuple(config.op_types))
        if layer.name in floats
        and floats[layer.name].input[1] in float_inits
        and (config.nodes is None or layer.name in config.nodes)
    ]
    if not layers:
        return 0
    reference = session_with_outputs(float_path, [floats[layer.name].output[0] for layer in layers], optimize=True)
    changed = 0
    for index, layer in enumerate(layers):
        start = time.perf_counter()
        float_node = floats[layer.name]
        weight = numpy_helper.to_array(float_inits[float_node.input[1]]).astype(np.float32)
        if weight.shape != next(tuple(i.dims) for i in model.graph.initializer if i.name == layer.weight_init):
            continue
        session = session_with_outputs(model, [layer.node.input[0]], optimize=False)
        x, target = paired_tensors(session, layer.node.input[0], reference, float_node.output[0], calibration)
        del session
        op = layer_op(layer, weight.shape, x, target, _relu_after(float_model, float_node))
        channels = target.shape[1] if layer.node.op_type == "Conv" else target.shape[-1]
        bias = layer_bias(model, layer, channels)
        grid = Quantizer(layer.scale, layer.zero_point, layer.qmin, layer.qmax)
        current = integer_weight(model, layer)
        before = layer_error(op, _dequant(current, grid), bias)
        seed = config.seed + index
        new_bias = bias
        train_bias = config.optim == "adaquant" and can_set_bias(model, layer)  # Conv/Gemm; a MatMul has none
        if config.optim == "adaround":
            ints = adaround(op, weight, bias, grid, iterations, rate, seed)
        else:
            ints, new_bias = adaquant(op, weight, bias, grid, iterations, rate, seed, train_bias)
        after = layer_error(op, _dequant(ints, grid), new_bias)
        keep = after < before
        log.info(
            "fast_finetune: %s %s error %.3g -> %.3g (%s, %.1fs)",
            config.optim,
            layer.name,
            before,
            after,
            "kept" if keep else "reverted",
            time.perf_counter() - start,
        )
        if keep:
            set_integer_weight(model, layer, ints)
            if train_bias:
                set_bias(model, layer, new_bias)
            changed += 1
        del op, x, target
    return changed


def _dequant(ints: np.ndarray, grid: Quantizer) -> np.ndarray:
    return ((ints - grid.zero_point) * grid.scale).astype(np.float32)
