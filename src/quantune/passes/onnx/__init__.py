"""Passes built on onnxruntime: graph optimization, dynamic and static quantization."""

from __future__ import annotations

from quantune.passes.onnx.dynamic_quant import DynamicQuantization
from quantune.passes.onnx.graph_opt import GraphOptimization
from quantune.passes.onnx.static_quant import StaticQuantization

__all__ = ["DynamicQuantization", "GraphOptimization", "StaticQuantization"]
