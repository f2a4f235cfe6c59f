"""Per-operator quantization sensitivity from one pass of calibration data, not one evaluation per op.

By job: :mod:`.stats` (the streaming statistics and the report), :mod:`.capture` (which
tensors one run captures, in groups sized to the memory budget), :mod:`.static` (a QDQ
quantization against its float model), :mod:`.dynamic` (what ``quantize_dynamic`` would do),
:mod:`.probe` (the flow's passes through the cache, then a measurement, in a worker).
"""

from __future__ import annotations

from quantune.evaluate.sensitivity.dynamic import _fake_quant, measure_dynamic
from quantune.evaluate.sensitivity.head import culprits, measure_head
from quantune.evaluate.sensitivity.probe import VERSION, ProbeJob, SensitivityProbe, StepConfigs, run_probe
from quantune.evaluate.sensitivity.static import measure
from quantune.evaluate.sensitivity.stats import SensitivityReport, _Stats

__all__ = [
    "VERSION",
    "ProbeJob",
    "SensitivityProbe",
    "SensitivityReport",
    "StepConfigs",
    "_Stats",
    "_fake_quant",
    "culprits",
    "measure",
    "measure_dynamic",
    "measure_head",
    "run_probe",
]
