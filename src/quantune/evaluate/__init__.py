"""Measuring models: accuracy metrics, agreement with the original, latency, size; the criterion."""

from __future__ import annotations

from quantune.evaluate.backend import LocalBackend
from quantune.evaluate.criterion import Criterion
from quantune.evaluate.evaluator import EvaluationSpec, Evaluator
from quantune.evaluate.latency import (
    LatencySpec,
    TimingRequest,
    measure_side_by_side,
    time_side_by_side,
)
from quantune.evaluate.metric_registry import metric_names, register_metric
from quantune.evaluate.metrics import AGREEMENT_METRICS, LABEL_METRICS, metric_direction
from quantune.evaluate.paired import RatioInterval, paired_ratio
from quantune.evaluate.quantized import count_quantized, quantization_figures
from quantune.evaluate.session import open_session, session_options
from quantune.evaluate.target_backend import TargetBackend

__all__ = [
    "AGREEMENT_METRICS",
    "LABEL_METRICS",
    "Criterion",
    "EvaluationSpec",
    "Evaluator",
    "LatencySpec",
    "LocalBackend",
    "RatioInterval",
    "TargetBackend",
    "TimingRequest",
    "count_quantized",
    "measure_side_by_side",
    "metric_direction",
    "metric_names",
    "open_session",
    "paired_ratio",
    "quantization_figures",
    "register_metric",
    "session_options",
    "time_side_by_side",
]
