"""Samplers by name, so configs say ``sampler: tpe`` and users can add their own.

A sampler is a :class:`~quantune.search.Sampler` subclass with ``ask`` and, if it learns,
``tell``, constructed as ``cls(seed=..., **options)``. It registers in code with
``@register_sampler("name")`` or comes from an installed package's ``quantune.samplers``
entry point::

    [project.entry-points."quantune.samplers"]
    annealing = "my_plugin.samplers:AnnealingSampler"

(see :mod:`quantune.registry` for the rules every registry shares).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from quantune.registry import Registry

if TYPE_CHECKING:
    from quantune.search.base import Sampler

ENTRY_POINT_GROUP = "quantune.samplers"


def _is_sampler(obj: object) -> bool:
    from quantune.search.base import Sampler

    return isinstance(obj, type) and issubclass(obj, Sampler)


SAMPLERS: Registry[type[Sampler]] = Registry(
    "sampler", ENTRY_POINT_GROUP, field="search.sampler", accepts=_is_sampler, expected="a quantune Sampler subclass"
)
S = TypeVar("S", bound="type[Sampler]")


def register_sampler(name: str) -> Callable[[S], S]:
    """Class decorator that makes a sampler available under ``name``."""
    return SAMPLERS.decorator(name)


def sampler_names() -> list[str]:
    """Registered samplers and installed plugins (entry points), sorted."""
    return SAMPLERS.names()


def get_sampler(name: str) -> type[Sampler]:
    """The class registered as ``name``, loading a plugin's entry point if need be."""
    return SAMPLERS.get(name)


def create_sampler(name: str, seed: int | None = 0, **options: Any) -> Sampler:
    """Instantiates the sampler registered as ``name``; unknown names list the known ones."""
    return get_sampler(name)(seed=seed, **options)
