"""Metrics by name: the built-in ones and those users add (``@register_metric("name")`` in a
module under ``plugins:``, or a ``quantune.metrics`` entry point), with the custom-metric signature
``score(outputs, data) -> float``. Higher is better unless the function has ``higher_is_better = False``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from quantune.evaluate.metrics import AGREEMENT_METRICS, LABEL_METRICS
from quantune.registry import Registry

MetricFunction = Callable[[dict[str, Any], dict[str, Any]], float]
F = TypeVar("F", bound=MetricFunction)

METRICS: Registry[MetricFunction] = Registry(
    "metric",
    "quantune.metrics",
    field="evaluation.metric",
    accepts=callable,
    expected="a function score(outputs, data) -> float",
)


def register_metric(name: str, *, higher_is_better: bool = True) -> Callable[[F], F]:
    """Function decorator: makes ``score(outputs, data) -> float`` available as ``name``."""
    if name in LABEL_METRICS or name in AGREEMENT_METRICS:
        raise ValueError(f"'{name}' is a built-in metric; choose another name")

    def decorate(func: F) -> F:
        func.higher_is_better = higher_is_better  # type: ignore[attr-defined]
        return METRICS.add(name, func)

    return decorate


def metric_names() -> list[str]:
    """Every metric ``evaluation.metric`` may name: built-in and added."""
    return sorted(set(LABEL_METRICS) | set(AGREEMENT_METRICS) | set(METRICS.names()))


def find_metric(name: str) -> MetricFunction | None:
    """The added metric ``name`` (loading its plugin if need be), or None."""
    return METRICS.find(name)


def metric_source(name: str, func: MetricFunction) -> str:
    """What identifies an added metric's code in cache keys: its plugin and version, or its qualified name."""
    return METRICS.source(name) or f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', name)}"
