"""quantune: searches optimization passes and quantization settings for the fastest ONNX model
that keeps its accuracy.

>>> import quantune
>>> result = quantune.tune("examples/digits/config.yaml")  # doctest: +SKIP
>>> result.best_model_path  # doctest: +SKIP

Public names are imported on first use (PEP 562), so ``import quantune`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantune._lazy import lazy_exports
from quantune._version import __version__

_EXPORTS = {
    "tune": "quantune.api",
    "check": "quantune.api",
    "Config": "quantune.config",
    "load_config": "quantune.config",
    "Engine": "quantune.engine",
    "Trial": "quantune.engine",
    "TrialRecord": "quantune.engine",
    "ConfigError": "quantune.errors",
    "DiskFull": "quantune.errors",
    "EnvironmentFault": "quantune.errors",
    "QuantuneError": "quantune.errors",
    "TrialError": "quantune.errors",
    "Criterion": "quantune.evaluate",
    "metric_names": "quantune.evaluate",
    "register_metric": "quantune.evaluate",
    "Registry": "quantune.registry",
    "Pass": "quantune.passes",
    "PassConfig": "quantune.passes",
    "get_pass": "quantune.passes",
    "pass_names": "quantune.passes",
    "register_pass": "quantune.passes",
    "Result": "quantune.report",
    "write_report": "quantune.report",
    "Feedback": "quantune.search",
    "Sampler": "quantune.search",
    "create_sampler": "quantune.search",
    "register_sampler": "quantune.search",
    "sampler_names": "quantune.search",
    "Boolean": "quantune.space",
    "Categorical": "quantune.space",
    "Conditional": "quantune.space",
    "FloatRange": "quantune.space",
    "IntRange": "quantune.space",
    "Joint": "quantune.space",
    "SearchSpace": "quantune.space",
    "Strategy": "quantune.strategy",
    "register_strategy": "quantune.strategy",
    "strategy_names": "quantune.strategy",
    "init_project": "quantune.starter",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


__getattr__ = lazy_exports("quantune", _EXPORTS, globals())


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # names for type checkers and IDEs; loaded lazily above
    from quantune.api import check, tune  # noqa: F401
    from quantune.config import Config, load_config  # noqa: F401
    from quantune.engine import Engine, Trial, TrialRecord  # noqa: F401
    from quantune.errors import ConfigError, DiskFull, EnvironmentFault, QuantuneError, TrialError  # noqa: F401
    from quantune.evaluate import Criterion, metric_names, register_metric  # noqa: F401
    from quantune.passes import Pass, PassConfig, get_pass, pass_names, register_pass  # noqa: F401
    from quantune.registry import Registry  # noqa: F401
    from quantune.report import Result  # noqa: F401
    from quantune.search import Feedback, Sampler, create_sampler, register_sampler, sampler_names  # noqa: F401
    from quantune.space import Boolean, Categorical, Conditional, FloatRange, IntRange, Joint, SearchSpace  # noqa: F401
    from quantune.starter import init_project  # noqa: F401
    from quantune.strategy import Strategy, register_strategy, strategy_names  # noqa: F401
