"""Latency measured, never assumed: warm-up, then repeated timed runs of one fixed batch.

Threads are set explicitly (default 1) so figures are comparable between models and runs;
spinning is disabled so an idle thread pool does not eat the other core.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort


@dataclass(frozen=True)
class LatencySpec:
    warmup: int = 10
    repeats: int = 50
    threads: int = 1
    batch_size: int | None = None  # None: the data's batch size


@contextlib.contextmanager
def latency_lane() -> Iterator[None]:
    """One latency measurement at a time on this machine, whatever process or worker asks.

    Parallel trials evaluate accuracy side by side, but a timing taken while another trial
    computes would measure the other trial too; a lock file serialises the timed part.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: no lane, measurements may overlap
        yield
        return
    path = Path(os.environ.get("QUANTUNE_LATENCY_LOCK") or Path(tempfile.gettempdir()) / "quantune-latency.lock")
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _timing_session(model: Path, spec: LatencySpec) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = spec.threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def _figures(timings: np.ndarray) -> dict[str, float]:
    timings = timings * 1000.0
    return {
        "latency_ms": float(np.median(timings)),
        "latency_p90_ms": float(np.percentile(timings, 90)),
        "latency_mean_ms": float(np.mean(timings)),
    }


def measure_latency(model: Path, feeds: dict[str, np.ndarray], spec: LatencySpec) -> dict[str, float]:
    """Median, p90 and mean of ``spec.repeats`` timed runs, in milliseconds, in the exclusive lane."""
    session = _timing_session(model, spec)
    timings = np.empty(spec.repeats)
    with latency_lane():
        for _ in range(spec.warmup):
            session.run(None, feeds)
        for index in range(spec.repeats):
            start = time.perf_counter()
            session.run(None, feeds)
            timings[index] = time.perf_counter() - start
    return _figures(timings)


def measure_side_by_side(models: list[Path], feeds: dict[str, np.ndarray], spec: LatencySpec) -> list[dict[str, float]]:
    """``measure_latency`` for several models at once, interleaved: round ``i`` times each model once.

    Whatever else the machine does drifts over minutes; interleaving spreads that drift over
    every model alike, so their ratios hold even when their absolute figures move.
    """
    return [_figures(row) for row in time_side_by_side(models, feeds, spec)]


def time_side_by_side(models: list[Path], feeds: dict[str, np.ndarray], spec: LatencySpec) -> np.ndarray:
    """The raw timings of ``measure_side_by_side``: seconds, one row per model, one column per
    round (``[i, r]`` and ``[j, r]`` were timed back to back, so their ratio is a paired one)."""
    sessions = [_timing_session(model, spec) for model in models]
    timings = np.empty((len(sessions), spec.repeats))
    with latency_lane():
        for session in sessions:
            for _ in range(spec.warmup):
                session.run(None, feeds)
        for index in range(spec.repeats):
            for row, session in enumerate(sessions):
                start = time.perf_counter()
                session.run(None, feeds)
                timings[row, index] = time.perf_counter() - start
    return timings


def latency_figures(timings_s: np.ndarray) -> dict[str, float]:
    """Median, p90 and mean in milliseconds of one model's timed runs (seconds)."""
    return _figures(np.asarray(timings_s, dtype=np.float64))
