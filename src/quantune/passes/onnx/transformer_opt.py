"""onnxruntime's transformer optimizer: BERT-like subgraphs fused into Attention,
SkipLayerNormalization, BiasGelu/FastGelu and EmbedLayerNormalization kernels.

Olive's CPU recipe for BERT-like models is fusion, then quantization: the fused kernels are
faster in fp32, and ``quantize_dynamic`` turns Attention into QAttention. After fusion
``dynamic_quant``, QDQ ``static_quant`` and ``weight_only`` work; QOperator ``static_quant``
fails in the quantizer, so it is pruned (:mod:`quantune.passes.onnx.compat`).
``num_heads``/``hidden_size`` 0 let onnxruntime read them from the graph. ``opt_level`` > 0
first runs onnxruntime's graph optimizer here, so it needs no torch (``optimize_model`` imports it).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import onnx
import onnxruntime as ort

from quantune.errors import TrialError
from quantune.passes.base import Pass, PassConfig, PassContext
from quantune.passes.onnx.pre_optimize import save_optimized
from quantune.passes.registry import register_pass
from quantune.space import Categorical

# The fused op each fusion option makes, for the check that fusion happened.
FUSED_OPS = (
    "Attention",
    "MultiHeadAttention",
    "SkipLayerNormalization",
    "EmbedLayerNormalization",
    "BiasGelu",
    "FastGelu",
    "Gelu",
    "SkipSimplifiedLayerNormalization",
    "RotaryEmbedding",
)
MODEL_TYPES = ("auto", "bert", "bart", "gpt2", "t5", "vit", "clip", "swin", "phi", "conformer")
# optimize_model's own choice for opt_level > 1: these break attention fusion.
_DISABLED_AT_EXTENDED = (
    "MatMulScaleFusion",
    "MatMulAddFusion",
    "MatmulTransposeFusion",
    "GemmActivationFusion",
    "BiasSoftmaxFusion",
)
_LEVELS = {1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, 2: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}


class TransformerOptConfig(PassConfig):
    model_type: Literal[MODEL_TYPES] = "auto"  # type: ignore[valid-type]
    num_heads: int = 0
    hidden_size: int = 0
    opt_level: Literal[0, 1, 2] = 0
    attention: bool = True
    skip_layer_norm: bool = True
    embed_layer_norm: bool = True
    bias_gelu: bool = True
    gelu_approximation: bool = False  # Gelu/BiasGelu -> FastGelu (tanh form): faster, not exact


@register_pass
class TransformerOptimization(Pass):
    """Fuses transformer subgraphs into onnxruntime's contrib kernels (``optimize_model``)."""

    name = "transformer_opt"
    role = "optimize"
    restructuring = True
    auto_place = "fuse"
    Config = TransformerOptConfig
    providers = ("CPUExecutionProvider", "CUDAExecutionProvider", "ROCMExecutionProvider", "DmlExecutionProvider")
    # Priors: full fusion first; leaving EmbedLayerNormalization or Attention unfused keeps a
    # quantizer that cannot take them in play.
    search_space = {
        "opt_level": Categorical((0, 1, 2), weights=(2, 1, 1)),
        "gelu_approximation": Categorical((False, True), weights=(2, 1)),
        "embed_layer_norm": Categorical((True, False), weights=(2, 1)),
        "attention": Categorical((True, False), weights=(2, 1)),
    }

    @classmethod
    def accepts(cls, config: PassConfig, upstream: list[tuple[str, PassConfig]]) -> bool:
        """First in a flow, or after graph_opt at disable/basic only: later the patterns no longer match."""
        return all(name == "graph_opt" and getattr(c, "level", None) in ("disable", "basic") for name, c in upstream)

    @classmethod
    def supports(cls, config: PassConfig, facts: Mapping[str, Any], upstream: list[tuple[str, PassConfig]]) -> bool:
        ops = facts.get("op_types")
        if ops is None:
            return True  # facts from before this key existed: the run checks that something fused
        return is_transformer(ops)

    def run(self, config: TransformerOptConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        from onnxruntime.transformers.fusion_options import FusionOptions
        from onnxruntime.transformers.optimizer import optimize_model

        model_type = detect_model_type(model_in) if config.model_type == "auto" else config.model_type
        options = FusionOptions(model_type)
        options.enable_attention = config.attention
        options.enable_skip_layer_norm = config.skip_layer_norm
        options.enable_bias_skip_layer_norm = config.skip_layer_norm
        options.enable_embed_layer_norm = config.embed_layer_norm
        options.enable_bias_gelu = config.bias_gelu
        options.enable_gelu_approximation = config.gelu_approximation
        quiet = logging.getLogger("onnxruntime.transformers")  # logs each fusion at INFO, warnings per miss
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            with tempfile.TemporaryDirectory(prefix="quantune-fuse-", dir=context.work_dir) as tmp:
                source = model_in
                if config.opt_level:  # onnxruntime's graph optimizer first, here, so it needs no torch
                    source = Path(tmp) / "pre.onnx"
                    disabled = ["ConstantSharing", *(_DISABLED_AT_EXTENDED if config.opt_level > 1 else ())]
                    save_optimized(model_in, source, _LEVELS[config.opt_level], disabled)
                optimized = optimize_model(
                    str(source),
                    model_type=model_type,
                    num_heads=config.num_heads,
                    hidden_size=config.hidden_size,
                    optimization_options=options,
                    opt_level=0,
                )
        finally:
            quiet.setLevel(level)
        fused = {op: count for op, count in optimized.get_fused_operator_statistics().items() if count}
        if not any(op in FUSED_OPS for op in fused):
            raise TrialError(f"transformer_opt: nothing fused as '{model_type}' (not a transformer of that type?)")
        large = optimized.model.ByteSize() > 2**31 - 2**26
        optimized.save_model_to_file(str(model_out), use_external_data_format=large)


def is_transformer(op_types: Mapping[str, int]) -> bool:
    """Attention (Softmax and MatMul) with a layer norm, or a graph already holding fused attention."""
    if op_types.get("Attention") or op_types.get("MultiHeadAttention"):
        return True
    norm = op_types.get("LayerNormalization") or op_types.get("SkipLayerNormalization") or op_types.get("ReduceMean")
    return bool(op_types.get("Softmax") and op_types.get("MatMul", 0) >= 2 and norm)


def detect_model_type(path: Path) -> str:
    """``gpt2`` with past key/values, ``vit`` for image input, else ``bert`` (the general pattern set)."""
    model = onnx.load(str(path), load_external_data=False)
    names = [value.name.lower() for value in model.graph.input]
    if any("past" in name for name in names):
        return "gpt2"
    floats = [value for value in model.graph.input if value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT]
    if floats and len(floats[0].type.tensor_type.shape.dim) == 4 and not any("ids" in name for name in names):
        return "vit"
    return "bert"
