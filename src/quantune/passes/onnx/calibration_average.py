"""Moving-average MinMax calibration (``CalibMovingAverage``), fed one batch at a time.

onnxruntime averages the per-batch extremes over one ``collect_data`` call (or per
``CalibStridedMinMax`` batches, merged by an exponential moving average). Feeding its
calibrator one batch per call, as :mod:`.calibration` does, would make every batch a stride; so
here the per-batch extremes are averaged exactly as the one-call run does, in a batch's memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
from onnxruntime.quantization import CalibrationMethod
from onnxruntime.quantization.calibrate import CalibrationDataReader, TensorData, TensorsData

Feed = dict[str, np.ndarray]


class _One(CalibrationDataReader):
    def __init__(self, feed: Feed) -> None:
        self._feed: Feed | None = feed

    def get_next(self) -> Feed | None:
        feed, self._feed = self._feed, None
        return feed


def _strides(feeds: Iterable[Feed], size: int | None) -> Iterator[list[Feed]]:
    chunk: list[Feed] = []
    for feed in feeds:
        chunk.append(feed)
        if size is not None and len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def moving_average_ranges(
    calibrator: Any, feeds: Iterable[Feed], *, symmetric: bool, constant: float, stride: int | None
) -> TensorsData:
    """The ranges of ``quantize_static``'s moving-average MinMax from a plain MinMax ``calibrator``
    (created with ``moving_average`` and ``symmetric`` off), one batch in memory at a time."""
    merged: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for chunk in _strides(feeds, stride):
        lows: dict[str, list[np.ndarray]] = {}
        highs: dict[str, list[np.ndarray]] = {}
        for feed in chunk:
            calibrator.calibrate_tensors_range = None  # this batch's extremes alone
            calibrator.collect_data(_One(feed))
            for name, data in calibrator.calibrate_tensors_range.items():
                low, high = data.range_value
                lows.setdefault(name, []).append(np.asarray(low, np.float64))
                highs.setdefault(name, []).append(np.asarray(high, np.float64))
        for name in lows:
            low, high = np.nanmean(lows[name], axis=0), np.nanmean(highs[name], axis=0)
            if symmetric:
                top = np.nanmax([np.abs(low), np.abs(high)], axis=0)
                low, high = -top, top
            if name in merged:
                old_low, old_high = merged[name]
                low, high = old_low + constant * (low - old_low), old_high + constant * (high - old_high)
            merged[name] = (low, high)
    calibrator.calibrate_tensors_range = None
    data = {
        name: TensorData(lowest=np.asarray(low, np.float32), highest=np.asarray(high, np.float32))
        for name, (low, high) in merged.items()
    }
    return TensorsData(CalibrationMethod.MinMax, data)


def uses_moving_average(method: CalibrationMethod, options: dict | None) -> bool:
    return method == CalibrationMethod.MinMax and bool((options or {}).get("moving_average"))


def plain_options(options: dict | None) -> dict:
    """The calibrator options for the per-batch pass: averaging and symmetry are applied here."""
    return {k: v for k, v in (options or {}).items() if k not in ("moving_average", "symmetric", "averaging_constant")}


def run_moving_average(
    make_calibrator: Callable[[dict], Any], feeds: Callable[[], Iterable[Feed]], options: dict, stride: int | None
) -> TensorsData:
    calibrator = make_calibrator(plain_options(options))
    return moving_average_ranges(
        calibrator,
        feeds(),
        symmetric=bool(options.get("symmetric", False)),
        constant=float(options.get("averaging_constant", 0.01)),
        stride=stride,
    )
