"""``quantune init``: a starter config, loader and metric template that fit a model."""

from __future__ import annotations

from quantune.starter.init import InitResult, init_project
from quantune.starter.model_info import ModelInfo, TensorInfo, read_model

__all__ = ["InitResult", "ModelInfo", "TensorInfo", "init_project", "read_model"]
