"""Model transformations. Each pass declares its config class and default search values."""

from __future__ import annotations

from quantune.passes.base import Pass, PassConfig, PassContext
from quantune.passes.onnx import (
    BiasCorrection,
    CrossLayerEqualization,
    DynamicQuantization,
    FastFinetune,
    GraphOptimization,
    SmoothQuant,
    StaticQuantization,
)
from quantune.passes.registry import get_pass, pass_names, register_pass

__all__ = [
    "BiasCorrection",
    "CrossLayerEqualization",
    "DynamicQuantization",
    "FastFinetune",
    "GraphOptimization",
    "Pass",
    "PassConfig",
    "PassContext",
    "SmoothQuant",
    "StaticQuantization",
    "get_pass",
    "pass_names",
    "register_pass",
]
