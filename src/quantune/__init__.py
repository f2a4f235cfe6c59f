"""quantune: searches optimization passes and quantization settings for the fastest ONNX model
that keeps its accuracy.

>>> import quantune
>>> result = quantune.tune("examples/digits/config.yaml")  # doctest: +SKIP
>>> result.best_model_path  # doctest: +SKIP
"""

from __future__ import annotations

from quantune.api import tune
from quantune.config import Config, load_config
from quantune.engine import Engine, Trial, TrialRecord
from quantune.errors import ConfigError, QuantuneError, TrialError
from quantune.evaluate import Criterion
from quantune.passes import Pass, PassConfig, get_pass, pass_names, register_pass
from quantune.report import Result
from quantune.search import Feedback, Sampler, create_sampler, register_sampler, sampler_names
from quantune.space import Boolean, Categorical, Conditional, SearchSpace

__version__ = "0.1.0"

__all__ = [
    "Boolean",
    "Categorical",
    "Conditional",
    "Config",
    "ConfigError",
    "Criterion",
    "Engine",
    "Feedback",
    "Pass",
    "PassConfig",
    "QuantuneError",
    "Result",
    "Sampler",
    "SearchSpace",
    "Trial",
    "TrialError",
    "TrialRecord",
    "__version__",
    "create_sampler",
    "get_pass",
    "load_config",
    "pass_names",
    "register_pass",
    "register_sampler",
    "sampler_names",
    "tune",
]
