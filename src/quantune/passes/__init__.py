"""Model transformations. Each pass declares its config class and default search values."""

from __future__ import annotations

from quantune.passes.base import Knobs, Pass, PassConfig, PassContext
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
from quantune.passes.registry import get_pass, knob_names, pass_names, register_pass

__all__ = [
    "BiasCorrection",
    "CrossLayerEqualization",
    "DynamicQuantization",
    "FastFinetune",
    "Float16Conversion",
    "GraphOptimization",
    "Knobs",
    "Pass",
    "PassConfig",
    "PassContext",
    "SessionTuning",
    "SmoothQuant",
    "StaticQuantization",
    "TransformerOptimization",
    "WeightOnlyQuantization",
    "get_pass",
    "knob_names",
    "pass_names",
    "register_pass",
]
