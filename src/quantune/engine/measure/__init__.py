"""Measurements beside the trials: the original's evaluation, paired timings, speed ceilings, sensitivity probes, builds
ahead and the side-by-side confirmation. Names are imported on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantune._lazy import lazy_exports

_EXPORTS = {
    "SensitivityProbe": "quantune.engine.measure.sensitivity_probe",
    "ProbeJob": "quantune.engine.measure.sensitivity_probe",
    "run_probe": "quantune.engine.measure.sensitivity_probe",
    "Confirmation": "quantune.engine.measure.confirm",
    "confirm_latency": "quantune.engine.measure.confirm",
    "Prebuild": "quantune.engine.measure.prebuild",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports("quantune.engine.measure", _EXPORTS, globals())

if TYPE_CHECKING:  # names for type checkers and IDEs; loaded lazily above
    from quantune.engine.measure.confirm import Confirmation, confirm_latency  # noqa: F401
    from quantune.engine.measure.prebuild import Prebuild  # noqa: F401
    from quantune.engine.measure.sensitivity_probe import ProbeJob, SensitivityProbe, run_probe  # noqa: F401
