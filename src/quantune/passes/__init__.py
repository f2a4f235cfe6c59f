"""Model transformations. Each pass declares its config class and default search values."""

from __future__ import annotations

import quantune.passes.onnx  # noqa: F401 - registers the built-in passes
from quantune.passes.base import Knobs, Pass, PassConfig, PassContext
from quantune.passes.registry import get_pass, knob_names, pass_names, register_pass

__all__ = [
    "Knobs",
    "Pass",
    "PassConfig",
    "PassContext",
    "get_pass",
    "knob_names",
    "pass_names",
    "register_pass",
]
