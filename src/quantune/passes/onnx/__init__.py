"""Passes built on onnxruntime and onnx: graph optimization, dynamic and static quantization,
and the range-fixing recipes tried before any fallback (cross-layer equalization, SmoothQuant)."""

from __future__ import annotations

from quantune.graph.head import head_groups, head_nodes
from quantune.passes.onnx.bias_correction import BiasCorrection
from quantune.passes.onnx.cle import CrossLayerEqualization
from quantune.passes.onnx.dynamic_quant import DynamicQuantization
from quantune.passes.onnx.execution_provider import ExecutionProvider
from quantune.passes.onnx.fast_finetune import FastFinetune
from quantune.passes.onnx.fp16 import Float16Conversion
from quantune.passes.onnx.graph_opt import GraphOptimization
from quantune.passes.onnx.nncf_quant import NNCFQuantization
from quantune.passes.onnx.session_tuning import SessionTuning
from quantune.passes.onnx.smooth_quant import SmoothQuant
from quantune.passes.onnx.static_quant import StaticQuantization
from quantune.passes.onnx.transformer_opt import TransformerOptimization
from quantune.passes.onnx.weight_only import WeightOnlyQuantization
from quantune.passes.onnx.weight_only_qdq import WeightOnlyQDQ as WeightOnlyQDQ

__all__ = [
    "BiasCorrection",
    "CrossLayerEqualization",
    "DynamicQuantization",
    "ExecutionProvider",
    "FastFinetune",
    "Float16Conversion",
    "GraphOptimization",
    "NNCFQuantization",
    "SessionTuning",
    "SmoothQuant",
    "StaticQuantization",
    "TransformerOptimization",
    "WeightOnlyQuantization",
    "head_groups",
    "head_nodes",
]
