"""Runs one model over the evaluation data and returns all its figures.

Every candidate is measured the same way as the original: the criterion metric (from labels,
from agreement with the original's outputs, or from a user function), every agreement
metric, latency, and size on disk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnxruntime as ort

from quantune.data import Dataset
from quantune.errors import QuantuneError, TrialError
from quantune.evaluate.latency import LatencySpec, measure_latency, time_side_by_side
from quantune.evaluate.metrics import AGREEMENT_METRICS, LABEL_METRICS
from quantune.evaluate.quantized import quantization_figures
from quantune.model import model_size_bytes

UserMetric = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], float]


@dataclass(frozen=True)
class EvaluationSpec:
    """How to measure a model; its ``fingerprint`` is part of every evaluation cache key."""

    metric: str
    batch_size: int
    label_key: str = "label"
    latency: LatencySpec = field(default_factory=LatencySpec)
    user_metric: UserMetric | None = field(default=None, compare=False)
    # sha256 of the metric script, so an edited metric never reuses old figures.
    metric_source_sha256: str | None = None

    def fingerprint(self) -> dict[str, object]:
        return {
            "metric": self.metric,
            "metric_source": self.metric_source_sha256,
            "batch_size": self.batch_size,
            "label_key": self.label_key,
            "latency": vars(self.latency),
            "figures": 2,  # 2: quantized_ops and quantized_compute_fraction (older entries lack them)
        }


class Evaluator:
    """Measures models on one dataset against one reference (the original model's outputs)."""

    def __init__(self, spec: EvaluationSpec, dataset: Dataset, input_names: list[str], threads: int = 0) -> None:
        self.spec = spec
        self.threads = threads
        self.dataset = dataset
        self.input_names = input_names
        if spec.metric in LABEL_METRICS and spec.label_key not in dataset.arrays:
            raise QuantuneError(
                f"evaluation.metric: '{spec.metric}' needs labels, but the evaluation data has no "
                f"'{spec.label_key}' array (set data.label_key, or use an agreement metric such as "
                f"{sorted(AGREEMENT_METRICS)})"
            )
        self._latency_feeds = next(dataset.batches(input_names, spec.latency.batch_size or spec.batch_size))

    def outputs(self, model: Path) -> dict[str, np.ndarray]:
        """All outputs of ``model`` over the evaluation data, concatenated along the batch axis."""
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = self.threads
        try:
            session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise TrialError(f"onnxruntime cannot load the model: {exc}") from exc
        names = [out.name for out in session.get_outputs()]
        chunks: list[list[np.ndarray]] = [[] for _ in names]
        for batch in self.dataset.batches(self.input_names, self.spec.batch_size):
            for index, value in enumerate(session.run(names, batch)):
                chunks[index].append(value)
        return {name: np.concatenate(parts, axis=0) for name, parts in zip(names, chunks, strict=True)}

    def timings_side_by_side(
        self, models: list[Path], *, warmup: int | None = None, repeats: int | None = None
    ) -> np.ndarray:
        """Seconds per round of ``models`` timed interleaved on the latency batch (one row per
        model, see ``time_side_by_side``); ``warmup`` / ``repeats`` override the config's."""
        spec = self.spec.latency
        spec = replace(
            spec,
            warmup=spec.warmup if warmup is None else warmup,
            repeats=spec.repeats if repeats is None else repeats,
        )
        return time_side_by_side(models, self._latency_feeds, spec)

    def evaluate(self, model: Path, reference: dict[str, np.ndarray] | None) -> tuple[dict[str, float], dict]:
        """Figures for ``model``, and its outputs.

        ``reference`` is the original model's outputs; ``None`` means ``model`` is the original.
        """
        outputs = self.outputs(model)
        first = next(iter(outputs.values()))
        figures: dict[str, float] = {}
        if self.spec.metric in LABEL_METRICS:
            labels = self.dataset.arrays[self.spec.label_key]
            figures[self.spec.metric] = LABEL_METRICS[self.spec.metric](first, labels)
        elif self.spec.user_metric is not None:
            figures[self.spec.metric] = _call_user_metric(self.spec, outputs, self.dataset)
        ref_first = first if reference is None else next(iter(reference.values()))
        for name, func in AGREEMENT_METRICS.items():
            figures[name] = func(first, ref_first)
        figures.update(measure_latency(model, self._latency_feeds, self.spec.latency))
        figures["size_bytes"] = float(model_size_bytes(model))
        figures.update(quantization_figures(model))  # what actually runs quantized (0 for a float original)
        return figures, outputs


def _call_user_metric(spec: EvaluationSpec, outputs: dict[str, np.ndarray], dataset: Dataset) -> float:
    try:
        value = spec.user_metric(outputs, dict(dataset.arrays))  # type: ignore[misc]
        return float(value)
    except Exception as exc:
        raise TrialError(f"metric function '{spec.metric}' raised {type(exc).__name__}: {exc}") from exc
