"""Runs one model over the evaluation data, feed by feed, and returns all its figures: every
candidate is measured the same way as the original."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from quantune.data import Dataset
from quantune.errors import QuantuneError, TrialError
from quantune.evaluate.agreement import agreement_figures
from quantune.evaluate.backend import Backend, LocalBackend
from quantune.evaluate.feeds import FeedOutputs, over_feeds, pack, stacked_outputs, unpack
from quantune.evaluate.latency import FEWEST_ROUNDS, LatencySpec, Settled, TimingRequest, latency_figures
from quantune.evaluate.metrics import AGREEMENT_METRICS, LABEL_METRICS
from quantune.evaluate.quantized import QUANTIZED_COMPUTE_OPS, quantization_figures
from quantune.evaluate.rows import row_figures
from quantune.evaluate.target_client import TargetFault
from quantune.model import model_size_bytes

# The agreement figures of outputs with themselves (finite ones): what each metric gives them.
IDENTICAL = {"top1_agreement": 1.0, "cosine": 1.0, "l2": 0.0, "max_abs_diff": 0.0}

UserMetric = Callable[[dict[str, Any], dict[str, Any]], float]
# runner(session, feeds) -> outputs per feed: drives a model the way it is deployed (state carried
# between calls, a decoder loop) instead of one session.run per feed.
Runner = Callable[[ort.InferenceSession, list[dict[str, np.ndarray]]], list[dict[str, np.ndarray]]]


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
    runner: Runner | None = field(default=None, compare=False)
    runner_name: str | None = None
    runner_source_sha256: str | None = None  # likewise for the runner script
    # op types the run's passes leave quantized (their ``leaves_quantized`` trait), for quantized.py
    quantized_ops: frozenset[str] = frozenset()

    def fingerprint(self) -> dict[str, object]:
        return {
            "metric": self.metric,
            "metric_source": self.metric_source_sha256,
            "batch_size": self.batch_size,
            "label_key": self.label_key,
            "latency": vars(self.latency),
            "runner": self.runner_name,
            "runner_source": self.runner_source_sha256,
            "outputs": "per-feed",
            "figures": 5,  # bumped when the figures of an evaluation change
        } | ({"quantized_ops": sorted(extra)} if (extra := self.quantized_ops - QUANTIZED_COMPUTE_OPS) else {})


QUICK_WARMUP, QUICK_REPEATS = 3, 10  # rounds of a quick timing (Evaluator.quick_timing)


class Evaluator:
    """Measures models on one dataset against one reference (the original model's outputs)."""

    def __init__(
        self,
        spec: EvaluationSpec,
        dataset: Dataset,
        input_names: list[str],
        threads: int = 0,
        backend: Backend | None = None,
    ) -> None:
        self.spec = spec
        self.threads = threads
        # Short timings beside another evaluation: sharing the cores, more rounds buy no precision.
        self.quick_timing = False
        self.last_timing_s = 0.0  # what the last model's timing took (the run's cost estimate reads it)
        self.backend: Backend = backend if backend is not None else LocalBackend()
        self.dataset = dataset
        self.input_names = input_names
        if spec.metric in LABEL_METRICS and not dataset.has(spec.label_key):
            raise QuantuneError(
                f"evaluation.metric: '{spec.metric}' needs labels, but the evaluation data has no "
                f"'{spec.label_key}' array (set data.label_key, or use an agreement metric such as "
                f"{sorted(AGREEMENT_METRICS)})"
            )
        # A runner gets every array but the labels: it may supply inputs the model does not take.
        self.feed_names = input_names if spec.runner is None else [k for k in dataset.names() if k != spec.label_key]
        self.feeds = list(dataset.batches(self.feed_names, spec.batch_size))
        if not self.feeds:
            raise QuantuneError(f"{dataset.source}: holds no rows to evaluate on")
        self._latency_feeds = latency_feed(dataset, self.feed_names, spec)

    def outputs(self, model: Path, *, every_output: bool = True) -> FeedOutputs:
        """The outputs of ``model``, one dict per evaluation feed (only the first with ``every_output=False``)."""
        if self.spec.runner is None:
            return self.backend.outputs(model, self.feeds, threads=self.threads, runner=None, every_output=every_output)
        try:
            produced = self.backend.outputs(model, self.feeds, threads=self.threads, runner=self.spec.runner)
        except TrialError:
            raise
        except Exception as exc:
            raise TrialError(f"runner '{self.spec.runner_name}' raised {type(exc).__name__}: {exc}") from exc
        return check_runner_outputs(produced, len(self.feeds), self.spec.runner_name or "runner")

    @property
    def latency_feed(self) -> dict[str, np.ndarray]:
        return self._latency_feeds

    def timings_side_by_side(
        self,
        models: list[Path],
        *,
        warmup: int | None = None,
        repeats: int | None = None,
        deadline: float | None = None,
        min_rounds: int = 5,
        settled: Settled | None = None,
    ) -> np.ndarray:
        """Seconds per round of ``models`` timed interleaved (a row each), bounded by ``deadline`` and ``settled``."""
        spec = self.spec.latency
        spec = replace(
            spec,
            warmup=spec.warmup if warmup is None else warmup,
            repeats=spec.repeats if repeats is None else repeats,
        )
        request = TimingRequest(tuple(models), self._latency_feeds, spec, self.spec.runner, deadline=deadline)
        return self.backend.time(replace(request, min_rounds=min_rounds, settled=settled))

    def evaluate(
        self,
        model: Path,
        reference: dict[str, np.ndarray] | None,
        on_outputs: Callable[[dict[str, np.ndarray], dict[str, float]], None] | None = None,
        timed: Callable[[dict[str, float]], bool] | None = None,
    ) -> tuple[dict[str, float], dict]:
        """Figures for ``model``, and its outputs (packed for the cache, see ``feeds.pack``).

        ``reference``: the original's packed outputs (``None``: ``model`` is the original).
        ``on_outputs`` gets the packed outputs and metric before the timing, so a candidate beside
        the original can be judged while the original is still timed. ``timed``: told the figures,
        says whether the (costlier) speed figures are wanted.
        """
        try:
            measured = self.measure(model, on_outputs, speed=timed is None)
            figures = self.figures(measured, reference)
            if timed is not None and timed(figures):
                figures.update(self.speed_figures(model))
            return figures, pack(measured.outputs)
        except TargetFault as exc:
            raise TrialError(str(exc)) from None

    def speed_figures(self, model: Path) -> dict[str, float]:
        """``model``'s latency figures and the peak memory of a fresh session in its own process."""
        latency = self.spec.latency
        if self.quick_timing:
            latency = replace(
                latency, warmup=min(latency.warmup, QUICK_WARMUP), repeats=min(latency.repeats, QUICK_REPEATS)
            )
        started = time.perf_counter()
        timings = self.backend.time(
            TimingRequest((model,), self._latency_feeds, latency, self.spec.runner, min_rounds=FEWEST_ROUNDS)
        )  # cut after the fewest rounds: the decisions re-time side by side
        self.last_timing_s = time.perf_counter() - started
        figures = latency_figures(timings[0])
        figures["peak_memory_mb"] = self.backend.peak_memory_mb(model, self._latency_feeds, self.spec.latency.threads)
        return figures

    def measure(
        self,
        model: Path,
        on_outputs: Callable[[dict[str, np.ndarray], dict[str, float]], None] | None = None,
        speed: bool = True,
    ) -> Measured:
        """Every figure of ``model`` that needs no reference (:meth:`figures` adds the rest)."""
        # Only a user metric reads more than the first output: the rest are not held.
        outputs = self.outputs(model, every_output=self.spec.user_metric is not None)
        first = [next(iter(feed.values())) for feed in outputs]
        metric: dict[str, float] = {}
        if self.spec.metric in LABEL_METRICS:
            labels = self.dataset.parts(self.spec.label_key, self.spec.batch_size)
            try:
                metric[self.spec.metric] = over_feeds(self.spec.metric, LABEL_METRICS[self.spec.metric], first, labels)
            except ValueError as exc:  # labels that do not match the outputs (count, shape)
                raise TrialError(
                    f"metric '{self.spec.metric}' cannot compare the outputs with '{self.spec.label_key}': {exc}"
                ) from exc
        elif self.spec.user_metric is not None:
            metric[self.spec.metric] = _call_user_metric(self.spec, outputs, self.dataset)
        if on_outputs is not None:
            on_outputs(pack(outputs), dict(metric))
        rest: dict[str, float] = self.speed_figures(model) if speed else {}
        rest["size_bytes"] = float(model_size_bytes(model))
        rest.update(quantization_figures(model, self.spec.quantized_ops))
        return Measured(outputs, first, metric, rest)

    def figures(self, measured: Measured, reference: dict[str, np.ndarray] | None) -> dict[str, float]:
        """All the figures of a measured model: its own, and its agreement with ``reference``."""
        first = measured.first
        figures = dict(measured.metric)
        ref_first = None if reference is None else [next(iter(feed.values())) for feed in unpack(reference)]
        if ref_first is None and all(np.isfinite(output).all() for output in first):
            figures.update(IDENTICAL)
        else:
            figures.update(agreement_figures(first, first if ref_first is None else ref_first))
        labeled = self.spec.metric == "top1" and ref_first is not None
        labels = self.dataset.parts(self.spec.label_key, self.spec.batch_size) if labeled else None
        figures.update(row_figures(self.spec.metric, figures, first, ref_first, labels))
        figures.update(measured.rest)
        return figures


@dataclass
class Measured:
    """A model's outputs and the figures that need no reference."""

    outputs: FeedOutputs
    first: list[np.ndarray]  # each feed's first output (what the agreement metrics compare)
    metric: dict[str, float]
    rest: dict[str, float]  # latency, memory, size, quantization


def latency_feed(dataset: Dataset, input_names: list[str], spec: EvaluationSpec) -> dict[str, np.ndarray]:
    """The timed feed: feed ``latency.feed`` of the evaluation data."""
    index = spec.latency.feed
    for position, feed in enumerate(dataset.batches(input_names, spec.latency.batch_size or spec.batch_size)):
        if position == index:
            return feed
    raise QuantuneError(
        f"evaluation.latency.feed: {index} is past the last evaluation feed ({dataset.source} has "
        f"{len(list(dataset.batches(input_names, spec.latency.batch_size or spec.batch_size)))}); use a smaller index"
    )


def check_runner_outputs(produced: object, count: int, name: str) -> FeedOutputs:
    """The runner's outputs as a list of ``count`` dicts of arrays, or a ``TrialError`` saying what is wrong."""
    expected = f"a list of {count} dict(s) (output name -> array), one per feed"
    if not isinstance(produced, (list, tuple)) or len(produced) != count:
        size = f" of {len(produced)}" if isinstance(produced, (list, tuple)) else ""
        raise TrialError(f"runner '{name}' returned {type(produced).__name__}{size}; expected {expected}")
    outputs: FeedOutputs = []
    for index, item in enumerate(produced):
        if not isinstance(item, dict) or not item:
            raise TrialError(f"runner '{name}': item {index} is {type(item).__name__}; expected {expected}")
        try:
            outputs.append({str(key): np.asarray(value) for key, value in item.items()})
        except Exception as exc:
            raise TrialError(f"runner '{name}': item {index} holds a non-array ({exc})") from exc
    return outputs


def _call_user_metric(spec: EvaluationSpec, outputs: FeedOutputs, dataset: Dataset) -> float:
    try:
        value = spec.user_metric(stacked_outputs(outputs), dataset.view())  # type: ignore[misc]
    except Exception as exc:
        raise TrialError(f"metric function '{spec.metric}' raised {type(exc).__name__}: {exc}") from exc
    # float() would take "0.98" or True as a score, and a tuple's TypeError would read as the metric's.
    if (
        hasattr(value, "__float__")
        and not isinstance(value, bool | np.bool_)
        and tuple(getattr(value, "shape", ())) == ()
    ):
        try:  # a Python or NumPy number, a 0-d array or tensor
            return float(value)
        except (TypeError, ValueError):
            pass
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise TrialError(
        f"metric function '{spec.metric}' returned {type(value).__name__} {shown}; it must return one "
        "real number (a float or int, e.g. 0.98), not a string, bool, sequence, dict or None"
    )
