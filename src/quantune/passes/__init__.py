"""Model transformations. Each pass declares its config class and default search values."""

from __future__ import annotations

from quantune.passes.base import Pass, PassConfig, PassContext
from quantune.passes.onnx import (
    BiasCorrection,
    CrossLayerEqualization,
    DynamicQuantization,
    FastFinetune,
    Float16Conversion,
    GraphOptimization,
    SessionTuning,
    SmoothQuant,
    StaticQuantization,
    TransformerOptimization,
    WeightOnlyQuantization,
)
from quantune.passes.registry import get_pass, pass_names, register_pass

__all__ = [
    "BiasCorrection",
    "CrossLayerEqualization",
    "DynamicQuantization",
    "FastFinetune",
    "Float16Conversion",
    "GraphOptimization",
    "Pass",
    "PassConfig",
    "PassContext",
    "SessionTuning",
    "SmoothQuant",
    "StaticQuantization",
    "TransformerOptimization",
    "WeightOnlyQuantization",
    "get_pass",
    "pass_names",
    "register_pass",
]
