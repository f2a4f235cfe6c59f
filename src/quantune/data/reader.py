"""onnxruntime's calibration reader over a :class:`Dataset`, one feed per collection.

onnxruntime's histogram calibrators (Entropy, Percentile, Distribution) gather every batch's
intermediate tensors of one ``collect_data`` call in a list and turn it into one array with
``np.asarray`` (``HistogramCollector.collect_value``); batches of different shapes -- a ragged
last batch (80 rows at 32) or feeds of different widths -- fail there with "inhomogeneous
shape". Each ``collect_data`` call merges its histograms (and MinMax its ranges) into those of
the calls before. So the reader offers onnxruntime's own strided protocol (``__len__`` and
``set_range``, used with ``CalibStridedMinMax: 1``): one batch per call, merged by onnxruntime,
nothing dropped or padded -- and only one batch's tensors held at a time.
"""

from __future__ import annotations

from onnxruntime.quantization import CalibrationDataReader

from quantune.data.dataset import Dataset


class CalibrationReader(CalibrationDataReader):
    """Feeds ``limit`` rows of a dataset to onnxruntime's calibrator, one batch or feed at a time."""

    def __init__(self, dataset: Dataset, input_names: list[str], batch_size: int, limit: int | None) -> None:
        self._batches = list(dataset.batches(input_names, batch_size, limit))
        self._start = 0
        self._stop = len(self._batches)
        self._next = 0

    def __len__(self) -> int:
        return len(self._batches)

    def set_range(self, start_index: int, end_index: int) -> None:
        """Restricts ``get_next`` to batches ``start_index:end_index`` (onnxruntime's strided calibration)."""
        self._start, self._stop = start_index, min(end_index, len(self._batches))
        self._next = start_index

    def get_next(self) -> dict | None:
        if self._next >= self._stop:
            return None
        self._next += 1
        return self._batches[self._next - 1]

    def rewind(self) -> None:
        self._next = self._start
