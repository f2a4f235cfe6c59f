"""``quantune init``: a starter config, loader and metric template that fit a model."""

from __future__ import annotations

from quantune.starter.init import init_project
from quantune.starter.model_info import read_model

__all__ = ["init_project", "read_model"]
