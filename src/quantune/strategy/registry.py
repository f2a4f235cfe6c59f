"""Strategies by name (``search.strategy: pass-by-pass``), as Neural Compressor's strategy registry.

>>> from quantune.strategy import Strategy, register_strategy
>>> @register_strategy("mine")
... class Mine(Strategy):
...     def ask(self): return None
...     def tell(self, proposal, outcome): pass

Installed packages add strategies through the ``quantune.strategies`` entry point group
(see :mod:`quantune.registry`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from quantune.registry import Registry
from quantune.strategy.options import StrategyOptions, validate_options

if TYPE_CHECKING:
    from quantune.strategy.base import Strategy


def _is_strategy(obj: object) -> bool:
    from quantune.strategy.base import Strategy

    return isinstance(obj, type) and issubclass(obj, Strategy)


STRATEGIES: Registry[type[Strategy]] = Registry(
    "strategy",
    "quantune.strategies",
    field="search.strategy",
    accepts=_is_strategy,
    expected="a quantune Strategy subclass",
)
S = TypeVar("S", bound="type[Strategy]")


def register_strategy(name: str) -> Callable[[S], S]:
    return STRATEGIES.decorator(name)


def strategy_names() -> list[str]:
    return STRATEGIES.names()


def strategy_class(name: str) -> type[Strategy] | None:
    return STRATEGIES.find(name)


def create_strategy(name: str) -> Strategy:
    return STRATEGIES.get(name)()


def checked_options(strategy: str, raw: Mapping[str, Any]) -> StrategyOptions | dict[str, Any]:
    """``search.strategy_options`` as the named strategy's options model (as given, without one)."""
    cls = strategy_class(strategy)
    return validate_options(strategy, None if cls is None else cls.Options, raw)


def options_json_schemas() -> dict[str, Any]:
    """strategy name -> the JSON Schema of its options (for ``quantune schema``)."""
    return {
        name: cls.Options.model_json_schema() for name, cls in sorted(STRATEGIES.registered().items()) if cls.Options
    }
