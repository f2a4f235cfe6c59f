"""Model preparation before any pass: the form the quantizers assume, checked and cached.

>>> preparation = prepare_model(ModelHandle.from_path("model.onnx"), feeds, cache)  # doctest: +SKIP
>>> preparation.steps  # doctest: +SKIP
['3 Constant node(s) -> initializers', 'opset 12 -> 13']
"""

from __future__ import annotations

from quantune.prepare.facts import model_facts
from quantune.prepare.pipeline import DEFAULT_STEPS, Preparation, PrepareOptions, PrepareStep, prepare_model, unprepared

__all__ = [
    "DEFAULT_STEPS",
    "Preparation",
    "PrepareOptions",
    "PrepareStep",
    "model_facts",
    "prepare_model",
    "unprepared",
]
