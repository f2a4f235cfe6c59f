"""The run config: pydantic schemas, loading from YAML/JSON, and errors that name the field."""

from __future__ import annotations

from quantune.config.loader import LoadedConfig, load_config
from quantune.config.schema import (
    Config,
    CriterionConfig,
    DataConfig,
    EvaluationConfig,
    ExecutorConfig,
    LatencyConfig,
    PassEntry,
    PyTorchModelConfig,
    Rule,
    SearchConfig,
    StopConfig,
    TargetConfig,
)

__all__ = [
    "Config",
    "CriterionConfig",
    "DataConfig",
    "EvaluationConfig",
    "ExecutorConfig",
    "LatencyConfig",
    "LoadedConfig",
    "PassEntry",
    "PyTorchModelConfig",
    "Rule",
    "SearchConfig",
    "StopConfig",
    "TargetConfig",
    "load_config",
]
