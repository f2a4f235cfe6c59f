"""Datasets for calibration and evaluation: `.npz` files or a user function, as batches or
feeds, checked against the model's inputs before a run."""

from __future__ import annotations

from quantune.data.dataset import Dataset, load_dataset
from quantune.data.reader import CalibrationReader

__all__ = ["CalibrationReader", "Dataset", "load_dataset"]
