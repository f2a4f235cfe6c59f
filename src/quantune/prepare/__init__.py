"""Model preparation before any pass: the form the quantizers assume, checked and cached.

>>> preparation = prepare_model(ModelHandle.from_path("model.onnx"), feeds, cache)  # doctest: +SKIP
>>> preparation.steps  # doctest: +SKIP
['3 Constant node(s) -> initializers', 'opset 12 -> 13']
"""

from __future__ import annotations

from quantune.prepare.check import check_equivalent, outputs_differ, run_feeds
from quantune.prepare.facts import default_opset, model_facts, quantized_among
from quantune.prepare.pipeline import (
    DEFAULT_STEPS,
    PREPARE_VERSION,
    Preparation,
    PrepareOptions,
    PrepareStep,
    prepare_model,
    unprepared,
)

__all__ = [
    "DEFAULT_STEPS",
    "PREPARE_VERSION",
    "Preparation",
    "PrepareOptions",
    "PrepareStep",
    "check_equivalent",
    "default_opset",
    "model_facts",
    "outputs_differ",
    "prepare_model",
    "quantized_among",
    "run_feeds",
    "unprepared",
]
