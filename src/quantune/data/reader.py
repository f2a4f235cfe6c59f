"""onnxruntime's calibration reader over a :class:`Dataset`."""

from __future__ import annotations

from collections.abc import Iterator

from onnxruntime.quantization import CalibrationDataReader

from quantune.data.dataset import Dataset


class CalibrationReader(CalibrationDataReader):
    """Feeds ``limit`` rows of a dataset to onnxruntime's calibrator, ``batch_size`` at a time."""

    def __init__(self, dataset: Dataset, input_names: list[str], batch_size: int, limit: int | None) -> None:
        self._dataset = dataset
        self._names = input_names
        self._batch_size = batch_size
        self._limit = limit
        self._iter: Iterator[dict] | None = None

    def get_next(self) -> dict | None:
        if self._iter is None:
            self._iter = self._dataset.batches(self._names, self._batch_size, self._limit)
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = None
