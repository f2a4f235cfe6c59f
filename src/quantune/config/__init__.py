"""The run config: pydantic schemas, loading from YAML/JSON, and errors that name the field."""

from __future__ import annotations

from quantune.config.loader import LoadedConfig, load_config
from quantune.config.schema import Config, PassEntry, PyTorchModelConfig

__all__ = ["Config", "LoadedConfig", "PassEntry", "PyTorchModelConfig", "load_config"]
