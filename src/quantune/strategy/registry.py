"""Strategies by name (``search.strategy: pass-by-pass``), as Neural Compressor's strategy registry.

>>> from quantune.strategy import Strategy, register_strategy
>>> @register_strategy("mine")
... class Mine(Strategy):
...     def ask(self): return None
...     def tell(self, proposal, outcome): pass
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from quantune.errors import QuantuneError

if TYPE_CHECKING:
    from quantune.strategy.base import Strategy

_STRATEGIES: dict[str, type[Strategy]] = {}
S = TypeVar("S", bound="type[Strategy]")


def register_strategy(name: str) -> Callable[[S], S]:
    def decorate(cls: S) -> S:
        _STRATEGIES[name] = cls
        return cls

    return decorate


def strategy_names() -> list[str]:
    return sorted(_STRATEGIES)


def strategy_class(name: str) -> type[Strategy] | None:
    return _STRATEGIES.get(name)


def create_strategy(name: str) -> Strategy:
    try:
        return _STRATEGIES[name]()
    except KeyError:
        raise QuantuneError(f"search.strategy: unknown strategy '{name}'; choose one of {strategy_names()}") from None
