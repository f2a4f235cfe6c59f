"""onnxruntime dynamic quantization: int8 weights, activation ranges computed at run time.

``pre_optimize: extended`` runs onnxruntime's extended graph optimization first, as Neural
Compressor does for NLP models (see :mod:`.pre_optimize`). ``weight_type: mixed`` gives
convolutions uint8 weights and the rest int8: onnxruntime's ConvInteger is fast with uint8
weights only (int8 ones made the captcha model 1.7x slower than fp32), its MatMul kernels with
int8 ones (uint8 weights made MiniLM-L3 0.75x fp32 against 0.64x); on the captcha model (convs
+ LSTM + an 8,210-way MatMul) mixed ran at 0.61x fp32 against uint8's 0.63x.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import onnx
from onnxruntime.quantization import quantize_dynamic
from onnxruntime.quantization.registry import IntegerOpsRegistry

from quantune.passes.base import Pass, PassConfig, PassContext
from quantune.passes.onnx.compat import quantizer_accepts
from quantune.passes.onnx.pre_optimize import drop_types, optimize_extended
from quantune.passes.onnx.quant_types import QUANT_TYPES
from quantune.passes.registry import register_pass
from quantune.prepare.facts import facts_apply, quantized_among
from quantune.space import Boolean, Categorical

# Op types whose integer kernel is fast with uint8 weights only (ConvInteger): "mixed" gives them
# uint8 weights and every other op int8 ones.
UINT8_FAST = ("Conv",)


class DynamicQuantizationConfig(PassConfig):
    # "mixed": uint8 weights for convolutions, int8 for the rest (MatMul, LSTM, Gather, ...)
    weight_type: Literal["int8", "uint8", "mixed"] = "int8"
    per_channel: bool = False
    reduce_range: bool = False
    op_types_to_quantize: list[str] | None = None
    nodes_to_exclude: list[str] = []
    # "extended": onnxruntime's extended graph optimization first (fused LayerNorm, Gelu, ...)
    pre_optimize: Literal["none", "extended"] = "none"


@register_pass
class DynamicQuantization(Pass):
    """Quantizes weights ahead of time and activations on the fly (no calibration data)."""

    name = "dynamic_quant"
    Config = DynamicQuantizationConfig
    # DynamicQuantizeLinear / MatMulInteger / ConvInteger have CPU kernels only.
    providers = ("CPUExecutionProvider",)
    search_space = {
        "weight_type": Categorical(("int8", "mixed")),
        "per_channel": Boolean(),
        "reduce_range": Boolean(),
        "pre_optimize": Categorical(("none", "extended")),
    }

    # DynamicQuantizeLinear is an opset-11 op (onnxruntime's quantizer upgrades older models itself).
    min_opset = 11

    @classmethod
    def supports(cls, config: PassConfig, facts: Mapping[str, Any], upstream: list[tuple[str, PassConfig]]) -> bool:
        """ConvInteger needs the weights of the convolutions it quantizes as initializers."""
        assert isinstance(config, DynamicQuantizationConfig)
        if not facts_apply(facts, upstream):
            return True
        return not quantized_among(
            facts.get("computed_weights", ()), config.op_types_to_quantize, config.nodes_to_exclude
        )

    @classmethod
    def accepts(cls, config: PassConfig, upstream: list[tuple[str, PassConfig]]) -> bool:
        """Not after graph_opt at all: level 'all' rewrites convolutions to NCHWc layout ops whose quantized form onnxruntime cannot load."""
        if not quantizer_accepts(cls.name, config, upstream):  # after transformer_opt, fp16 (compat.py)
            return False
        return not any(name == "graph_opt" and getattr(c, "level", None) in ("all",) for name, c in upstream)

    def run(self, config: DynamicQuantizationConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        with tempfile.TemporaryDirectory(dir=model_out.parent) as scratch:
            added: list[str] = []
            if config.pre_optimize == "extended":
                optimized = Path(scratch) / "extended.onnx"
                added = optimize_extended(model_in, optimized)
                model_in = optimized
            if config.weight_type == "mixed":
                # (an empty op-type list means "all of them" to onnxruntime: skip a step that has none)
                first = _among(config.op_types_to_quantize, UINT8_FAST)
                rest = [t for t in config.op_types_to_quantize or IntegerOpsRegistry if t not in UINT8_FAST]
                convs = Path(scratch) / "convs.onnx"
                if first:
                    self._quantize(config, model_in, convs, "uint8", first)
                    model_in = convs
                if rest:
                    self._quantize(config, model_in, model_out, "int8", rest)
                else:
                    shutil.copyfile(model_in, model_out)
            else:
                self._quantize(config, model_in, model_out, config.weight_type, config.op_types_to_quantize)
            drop_types(model_out, added)

    def _quantize(
        self,
        config: DynamicQuantizationConfig,
        model_in: Path,
        model_out: Path,
        weight_type: str,
        op_types: list[str] | None,
    ) -> None:
        quantize_dynamic(
            str(model_in),
            str(model_out),
            weight_type=QUANT_TYPES[weight_type],
            per_channel=config.per_channel,
            reduce_range=config.reduce_range,
            op_types_to_quantize=op_types,
            nodes_to_exclude=list(config.nodes_to_exclude),
            # after graph_opt at extended/all, fused com.microsoft ops have no inferred types;
            # the quantizer then asks for this instead of failing the trial
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )


def _among(op_types: list[str] | None, wanted: tuple[str, ...]) -> list[str]:
    return [t for t in wanted if op_types is None or t in op_types]
