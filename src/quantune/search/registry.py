"""Samplers by name, so configs say ``sampler: tpe`` and users can add their own.

>>> from quantune.search import Sampler, register_sampler
>>> @register_sampler("first-only")
... class FirstOnly(Sampler):
...     def ask(self):
...         return None
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from quantune.errors import QuantuneError

if TYPE_CHECKING:
    from quantune.search.base import Sampler

_SAMPLERS: dict[str, type[Sampler]] = {}
S = TypeVar("S", bound="type[Sampler]")


def register_sampler(name: str) -> Callable[[S], S]:
    """Class decorator that makes a sampler available under ``name``."""

    def decorate(cls: S) -> S:
        _SAMPLERS[name] = cls
        return cls

    return decorate


def sampler_names() -> list[str]:
    return sorted(_SAMPLERS)


def create_sampler(name: str, seed: int | None = 0, **options: Any) -> Sampler:
    """Instantiates the sampler registered as ``name``; unknown names list the known ones."""
    try:
        cls = _SAMPLERS[name]
    except KeyError:
        raise QuantuneError(f"search.sampler: unknown sampler '{name}'; choose one of {sampler_names()}") from None
    return cls(seed=seed, **options)
