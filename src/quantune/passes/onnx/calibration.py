"""Calibration in chunks: activation ranges whose memory is bounded by a chunk, not by the data.

onnxruntime's calibrators keep every intermediate output of every batch fed in one
``collect_data`` call, and ``CalibMaxIntermediateOutputs`` is no way out (MinMax then clears what
it collected without folding it into the ranges). Both calibrator families merge across calls,
so the data is fed one chunk per call: as many rows as fit the memory budget (so data that fits
gives the one-shot result exactly), a larger batch split along a free first axis, and a batch of
another shape starting a new chunk (the histogram calibrators stack a chunk's arrays).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from onnxruntime.quantization import CalibrationMethod
from onnxruntime.quantization.calibrate import (
    CalibrationDataReader,
    HistogramCollector,
    TensorsData,
    create_calibrator,
)

from quantune.memory import memory_budget_mb, note_stage_peak, peak_tracker, rows_in_budget
from quantune.passes.onnx.calibration_average import run_moving_average, uses_moving_average

log = logging.getLogger("quantune.calibration")

_MB = 1024 * 1024
# A histogram calibrator's chunk holds its calibrated tensors as the run's arrays, then stacked
# (one tensor at a time) by the collectors: two copies on top of the run's own footprint.
_HELD_COPIES = 2

Feed = dict[str, np.ndarray]


class _ListReader(CalibrationDataReader):
    """One chunk, as onnxruntime's calibrators read it."""

    def __init__(self, feeds: Sequence[Feed]) -> None:
        self._feeds = iter(feeds)

    def get_next(self) -> Feed | None:
        return next(self._feeds, None)


def _rows(feed: Feed) -> int:
    return len(next(iter(feed.values())))


class ChunkPlanner:
    """Groups feeds into chunks of at most ``max_rows`` rows (``None``: one feed per chunk, never cut)."""

    def __init__(self, max_rows: int | None, splittable: bool) -> None:
        self.max_rows = max_rows
        self.splittable = splittable

    def pieces(self, feed: Feed) -> Iterator[Feed]:
        """``feed``, split along axis 0 into pieces of at most ``max_rows`` when allowed."""
        rows = _rows(feed)
        if self.max_rows is None or not self.splittable or rows <= self.max_rows:
            yield feed
            return
        for start in range(0, rows, self.max_rows):
            yield {name: value[start : start + self.max_rows] for name, value in feed.items()}

    def chunks(self, feeds: Iterable[Feed]) -> Iterator[list[Feed]]:
        chunk: list[Feed] = []
        rows = 0
        key = None
        for feed in feeds:
            if self.max_rows is None:
                yield [feed]
                continue
            for piece in self.pieces(feed):
                n = _rows(piece)
                piece_key = tuple((name, value.shape, value.dtype.str) for name, value in sorted(piece.items()))
                if chunk and (rows + n > self.max_rows or piece_key != key):
                    yield chunk
                    chunk, rows = [], 0
                chunk.append(piece)
                rows += n
                key = piece_key
        if chunk:
            yield chunk


def _rows_per_chunk(session, feed: Feed, splittable: bool, budget_mb: float, keeps_tensors: bool) -> int:
    """Rows a chunk may hold within the budget, measured on one row (plus a histogram's tensor copies)."""
    rows = _rows(feed)
    probe = {name: value[:1] for name, value in feed.items()} if splittable and rows > 1 else feed
    probe_rows = _rows(probe) if probe else 1

    def held_mb(outputs: list) -> float:
        tensors = sum(np.asarray(out).nbytes for out in outputs) + sum(value.nbytes for value in probe.values())
        return _HELD_COPIES * tensors / _MB if keeps_tensors else 0.0

    fit, _ = rows_in_budget(lambda: session.run(None, probe), budget_mb, held_mb)
    return max(1, fit * probe_rows)  # whole batches of a fixed batch dimension, or rows


def _seed_histograms(calibrator, extremes: TensorsData) -> None:
    """Starts every histogram at the whole data's range, with no counts yet: otherwise the first
    chunk fixes the bins and later chunks add uneven ones, so the counts would not add up to the
    one-shot histogram's."""
    collector = HistogramCollector(
        method=calibrator.method,
        symmetric=calibrator.symmetric,
        num_bins=calibrator.num_bins,
        num_quantized_bins=calibrator.num_quantized_bins,
        percentile=calibrator.percentile,
        scenario=calibrator.scenario,
    )
    absolute = calibrator.method == "percentile" and calibrator.symmetric
    for name in calibrator.tensors_to_calibrate or ():
        if name not in extremes:
            continue
        low, high = (np.asarray(v, dtype=np.float32) for v in extremes[name].range_value)
        low, high = np.float32(np.min(low)), np.float32(np.max(high))
        if absolute:  # bins over |x|; onnxruntime starts them at the smallest |x|, here at 0
            top = np.float32(max(abs(low), abs(high)))
            edges = np.linspace(0.0, float(top) if top > 0 else 1.0, calibrator.num_bins + 1)
            collector.histogram_dict[name] = (np.zeros(calibrator.num_bins, dtype=np.int64), edges, low, high)
        else:
            threshold = np.array(max(abs(low), abs(high)), dtype=np.float32)
            _, edges = np.histogram(np.zeros(0, np.float32), calibrator.num_bins, range=(-threshold, threshold))
            hist = np.zeros(calibrator.num_bins, dtype=np.int64)
            collector.histogram_dict[name] = (hist, edges, low, high, threshold)
    calibrator.collector = collector


def calibrate_ranges(
    model_path: str | Path,
    feeds: Callable[[], Iterable[Feed]],
    method: CalibrationMethod,
    *,
    op_types: Sequence[str] | None = None,
    options: dict | None = None,
    budget_mb: float | None = None,
    stride: int | None = None,
) -> TensorsData:
    """The activation ranges ``quantize_static`` would compute from the data, chunk by chunk.

    ``feeds()`` returns the batches afresh (histogram methods over several chunks read them twice);
    ``options`` are onnxruntime's calibrator options. Records the ``calibration`` stage's peak memory.
    """
    budget = memory_budget_mb() if budget_mb is None else budget_mb
    with peak_tracker() as peak, tempfile.TemporaryDirectory(prefix="quantune-calib-") as tmp:

        def calibrator_for(kind: CalibrationMethod, name: str = "", opts: dict | None = None):
            return create_calibrator(
                Path(model_path),
                list(op_types) if op_types else None,
                augmented_model_path=str(Path(tmp) / f"augmented-{name or kind.name}.onnx"),
                calibrate_method=kind,
                extra_options=dict(options or {}) if opts is None else opts,
            )

        if uses_moving_average(method, options):
            ranges = run_moving_average(
                lambda opts: calibrator_for(method, "average", opts), feeds, dict(options or {}), stride
            )
            note_stage_peak("calibration", peak.mb)
            return ranges
        calibrator = calibrator_for(method)
        first = next(iter(feeds()), None)
        if first is None:
            raise ValueError("calibration: no data to calibrate with (zero rows)")
        # a batch may be split when every model input's first dimension is symbolic
        splittable = all(
            not isinstance(arg.shape[0], int) if arg.shape else False for arg in calibrator.infer_session.get_inputs()
        )
        minmax = method == CalibrationMethod.MinMax
        max_rows = _rows_per_chunk(calibrator.infer_session, first, splittable, budget, keeps_tensors=not minmax)
        del first
        planner = ChunkPlanner(max_rows, splittable)
        count = sum(1 for _ in planner.chunks(feeds()))
        if count > 1 and not minmax:
            # the MinMax pass runs alone: two sessions' buffers are never held at once
            del calibrator
            extremes = calibrate_ranges(
                model_path, feeds, CalibrationMethod.MinMax, op_types=op_types, budget_mb=budget
            )
            calibrator = calibrator_for(method)
            _seed_histograms(calibrator, extremes)
        for chunk in planner.chunks(feeds()):
            calibrator.collect_data(_ListReader(chunk))
        ranges = calibrator.compute_data()
        del calibrator
    note_stage_peak("calibration", peak.mb)
    log.info(
        "calibration (%s): %d chunk(s) of at most %d rows (budget %.0f MB), peak %.0f MB",
        method.name,
        count,
        max_rows,
        budget,
        peak.mb,
    )
    return ranges
