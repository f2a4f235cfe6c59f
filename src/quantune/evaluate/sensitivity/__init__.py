"""Per-operator quantization sensitivity from one pass of calibration data, not one evaluation per op. This package only
measures; the engine's probe runs the flow's passes first."""

from __future__ import annotations

from quantune.evaluate.sensitivity.dynamic import fake_quant, measure_dynamic
from quantune.evaluate.sensitivity.head import culprits, measure_head
from quantune.evaluate.sensitivity.static import measure
from quantune.evaluate.sensitivity.stats import NodeStats, SensitivityReport

__all__ = [
    "NodeStats",
    "SensitivityReport",
    "culprits",
    "fake_quant",
    "measure",
    "measure_dynamic",
    "measure_head",
]
