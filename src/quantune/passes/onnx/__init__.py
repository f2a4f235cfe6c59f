"""Passes built on onnxruntime and onnx: graph optimization, dynamic and static quantization,
and the range-fixing recipes tried before any fallback (cross-layer equalization, SmoothQuant)."""

from __future__ import annotations

# Importing each pass's module registers the pass.
from quantune.passes.onnx import (  # noqa: F401
    bias_correction,
    cle,
    dynamic_quant,
    execution_provider,
    fast_finetune,
    fp16,
    graph_opt,
    nncf_quant,
    session_tuning,
    smooth_quant,
    static_quant,
    transformer_opt,
    weight_only,
    weight_only_qdq,
)
