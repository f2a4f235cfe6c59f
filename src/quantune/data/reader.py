"""onnxruntime's calibration reader over a :class:`Dataset`, one feed per collection.

The histogram calibrators stack one ``collect_data`` call's batches into one array, which
fails on batches of different shapes; this reader offers onnxruntime's strided protocol, one
batch per call merged by onnxruntime, so nothing is dropped or padded.
"""

from __future__ import annotations

from onnxruntime.quantization import CalibrationDataReader

from quantune.data.dataset import Dataset


class CalibrationReader(CalibrationDataReader):
    """Feeds ``limit`` rows of a dataset to onnxruntime's calibrator, one batch or feed at a time."""

    def __init__(self, dataset: Dataset, input_names: list[str], batch_size: int, limit: int | None) -> None:
        self._batches = list(dataset.batches(input_names, batch_size, limit))
        self._stop = len(self._batches)
        self._next = 0

    def __len__(self) -> int:
        return len(self._batches)

    def set_range(self, start_index: int, end_index: int) -> None:
        """Restricts ``get_next`` to batches ``start_index:end_index`` (onnxruntime's strided calibration)."""
        self._stop = min(end_index, len(self._batches))
        self._next = start_index

    def get_next(self) -> dict | None:
        if self._next >= self._stop:
            return None
        self._next += 1
        return self._batches[self._next - 1]
