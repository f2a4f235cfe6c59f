"""Weight-only 4-bit QDQ: each constant MatMul weight as blockwise int4 ``DequantizeLinear -> MatMul``.

The same blocks as ``weight_only`` (onnxruntime's ``MatMulNBitsQuantizer``, round to nearest,
one scale -- and zero point when asymmetric -- per ``block_size`` rows of a column), written in
standard ONNX ops instead of the ``com.microsoft`` ``MatMulNBits`` kernel. That is the form
QDQ accelerators read (OpenVINO, QNN, NPUs), and onnxruntime's CPU provider fuses it back into
``MatMulNBits`` when it loads the model (at the session's ``qdq_matmulnbits_accuracy_level``,
int8 compute by default). int4 ``DequantizeLinear`` needs opset 21: preparation raises the
model to it. onnxruntime writes only 4 bits in this form (its 8-bit MatMul form is QOperator).

The rest of the house knows this pass only by its traits (:mod:`quantune.passes.base`): it
quantizes weights (``"dynamic"``: the accuracy strategies fall back MatMuls through
``nodes_to_exclude``), the MatMuls it leaves behind count as quantized although they compute in
float in the graph, no pass that reads float weights follows it, and ``flows: auto`` places it
like ``weight_only``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx
from pydantic import Field, field_validator

from quantune.errors import TrialError
from quantune.passes.base import Knobs, Pass, PassConfig, PassContext
from quantune.passes.onnx.weight_only import save_model
from quantune.passes.registry import facts_apply, register_pass, weights_rewritten
from quantune.space import Categorical


class WeightOnlyQDQConfig(PassConfig):
    block_size: int = Field(default=32, ge=16, le=1024)
    symmetric: bool = True  # int4 weights (else uint4 with zero points)
    nodes_to_exclude: list[str] = []

    @field_validator("block_size")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError("block_size must be a power of two (16, 32, 64, 128, ...): blockwise DequantizeLinear")
        return value


@register_pass
class WeightOnlyQDQ(Pass):
    """Blockwise int4 weights for MatMuls with constant weights, as ``DequantizeLinear -> MatMul``."""

    name = "weight_only_qdq"
    Config = WeightOnlyQDQConfig
    # Small blocks hold accuracy best; symmetric int4 is what the QDQ accelerators take first.
    search_space = {
        "block_size": Categorical((32, 64, 128), weights=(2, 1, 1)),
        "symmetric": Categorical((True, False), weights=(2, 1)),
    }
    min_opset = 21  # int4 DequantizeLinear
    role = "quantize"
    knobs = Knobs(exclude="nodes_to_exclude")
    quantizes = "dynamic"
    leaves_quantized = frozenset({"MatMul"})  # a MatMul whose weight comes from DequantizeLinear
    rewrites_weights = True
    restructuring = True  # MatMul -> DequantizeLinear + MatMul, renamed
    auto_place = "weights"

    @classmethod
    def accepts(cls, config: PassConfig, upstream: list[tuple[str, PassConfig]]) -> bool:
        """Not after a pass that rewrote the weights: no float32 MatMul weights are left."""
        return not weights_rewritten(upstream)

    @classmethod
    def supports(cls, config: PassConfig, facts: Mapping[str, Any], upstream: list[tuple[str, PassConfig]]) -> bool:
        """The model needs a MatMul with a constant weight that is not excluded, and a ``block_size``
        whose half is below the largest such K (else it is the next smaller size's model)."""
        assert isinstance(config, WeightOnlyQDQConfig)
        if not facts_apply(facts, upstream) or "matmul_weights" not in facts:
            return True
        excluded = set(config.nodes_to_exclude)
        depths = [k for name, k, _ in facts["matmul_weights"] if not name or name not in excluded]
        return bool(depths) and (config.block_size == 16 or config.block_size // 2 < max(depths))

    def run(self, config: WeightOnlyQDQConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        try:
            from onnxruntime.quantization import QuantFormat
            from onnxruntime.quantization import matmul_nbits_quantizer as nbits
        except ImportError as exc:
            raise TrialError(
                f"{self.name} needs onnxruntime's MatMulNBits quantizer: {exc} (pip install onnx-ir)"
            ) from exc
        algo = nbits.DefaultWeightOnlyQuantConfig(
            block_size=config.block_size,
            is_symmetric=config.symmetric,
            bits=4,
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=("MatMul",),
        )
        quiet = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
        level = quiet.level
        quiet.setLevel(logging.WARNING)  # it logs a line per node at INFO
        try:
            quantizer = nbits.MatMulNBitsQuantizer(
                onnx.load(str(model_in)), nodes_to_exclude=list(config.nodes_to_exclude), algo_config=algo
            )
            quantizer.process()
        finally:
            quiet.setLevel(level)
        out = quantizer.model.model
        if not any(node.op_type == "DequantizeLinear" for node in out.graph.node):
            raise TrialError(f"{self.name}: no MatMul has a constant weight to quantize (nothing changed)")
        save_model(out, model_out)
