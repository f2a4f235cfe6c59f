"""Weight-only 4-bit QDQ: each constant MatMul weight as blockwise int4 ``DequantizeLinear -> MatMul``.

The same blocks as ``weight_only``, written in standard ONNX ops instead of the ``MatMulNBits``
kernel: the form QDQ accelerators read (OpenVINO, QNN, NPUs), which onnxruntime's CPU provider
fuses back into ``MatMulNBits`` when it loads the model. int4 ``DequantizeLinear`` needs opset 21.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from quantune.errors import TrialError
from quantune.passes.base import Knobs, Pass, PassConfig, PassContext
from quantune.passes.onnx.weight_only import blocks_fit, quantize_nbits, save_model
from quantune.passes.registry import register_pass, weights_rewritten
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
        assert isinstance(config, WeightOnlyQDQConfig)
        return blocks_fit(config.block_size, config.nodes_to_exclude, facts, upstream)

    def run(self, config: WeightOnlyQDQConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        from onnxruntime.quantization import QuantFormat

        def algorithm(nbits: Any) -> Any:
            return nbits.DefaultWeightOnlyQuantConfig(
                block_size=config.block_size,
                is_symmetric=config.symmetric,
                bits=4,
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=("MatMul",),
            )

        out = quantize_nbits(self.name, model_in, config.nodes_to_exclude, algorithm)
        if not any(node.op_type == "DequantizeLinear" for node in out.graph.node):
            raise TrialError(f"{self.name}: no MatMul has a constant weight to quantize (nothing changed)")
        save_model(out, model_out)
