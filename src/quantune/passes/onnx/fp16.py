"""float16 conversion: weights and activations in half precision, an op block list kept in fp32.

Half the weight bytes; faster only where the provider has fp16 kernels (on an x86 CPU usually
slower: the search measures it and the objective decides). The conversion is onnxruntime's copy
of onnxconverter-common's; ``keep_io_types`` keeps float32 inputs and outputs, and
``keep_fp32: numeric`` also keeps the ops fp16 cannot carry (softmax, normalizations, reductions,
exp/log/pow) in float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import onnx

from quantune.passes.base import Knobs, Pass, PassConfig, PassContext
from quantune.passes.onnx.weight_only import save_model
from quantune.passes.registry import register_pass, weights_rewritten
from quantune.space import Categorical

# Ops whose result fp16 cannot hold well. Not the fused contrib norms: the converter cannot type
# their float32 inputs (the model fails to load), and their fp16 kernels accumulate in float32.
NUMERIC_OPS = (
    "Softmax",
    "LogSoftmax",
    "LayerNormalization",
    "InstanceNormalization",
    "GroupNormalization",
    "ReduceMean",
    "ReduceSum",
    "ReduceSumSquare",
    "ReduceL2",
    "Pow",
    "Exp",
    "Log",
    "Sqrt",
    "Erf",
)


class Float16Config(PassConfig):
    keep_io_types: bool = True
    keep_fp32: Literal["none", "numeric"] = "numeric"
    op_block_list: list[str] = []
    nodes_to_exclude: list[str] = []


@register_pass
class Float16Conversion(Pass):
    """Converts float32 tensors to float16, keeping blocked ops (and the model's I/O) in float32."""

    name = "fp16"
    role = "convert"
    knobs = Knobs(exclude="nodes_to_exclude")
    rewrites_weights = True
    auto_place = "half"
    Config = Float16Config
    # Which block list holds accuracy is model-specific; measured, not guessed.
    search_space = {"keep_fp32": Categorical(("numeric", "none"), weights=(2, 1))}

    @classmethod
    def accepts(cls, config: PassConfig, upstream: list[tuple[str, PassConfig]]) -> bool:
        """Not after a pass that rewrote the weights (no float32 compute to halve, or QDQ math fp16 breaks)."""
        return not weights_rewritten(upstream)

    @classmethod
    def supports(cls, config: PassConfig, facts: Mapping[str, Any], upstream: list[tuple[str, PassConfig]]) -> bool:
        """A model of ops that are all blocked would come out unchanged (but for Casts)."""
        ops = facts.get("op_types")
        if not ops or upstream:
            return True
        blocked = set(config.op_block_list) | (set(NUMERIC_OPS) if config.keep_fp32 == "numeric" else set())
        return bool(set(ops) - blocked - _SHAPE_OPS)

    def run(self, config: Float16Config, model_in: Path, model_out: Path, context: PassContext) -> None:
        from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

        blocked = list(dict.fromkeys([*DEFAULT_OP_BLOCK_LIST, *config.op_block_list]))
        if config.keep_fp32 == "numeric":
            blocked += [op for op in NUMERIC_OPS if op not in blocked]
        model = onnx.load(str(model_in))
        converted = convert_float_to_float16(
            model,
            keep_io_types=config.keep_io_types,
            op_block_list=blocked,
            node_block_list=list(config.nodes_to_exclude) or None,
        )
        save_model(converted, model_out)


_SHAPE_OPS = frozenset(
    {"Shape", "Reshape", "Transpose", "Unsqueeze", "Squeeze", "Concat", "Gather", "Slice", "Identity", "Constant"}
)
