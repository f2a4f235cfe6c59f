"""Samplers by name, so configs say ``sampler: tpe`` and users can add their own.

Two ways to add a sampler (a :class:`~quantune.search.Sampler` subclass with ``ask`` and,
if it learns, ``tell``; constructed as ``cls(seed=..., **options)``):

1. In code, with the decorator, before the run starts:

   >>> from quantune.search import Sampler, register_sampler
   >>> @register_sampler("first-only")
   ... class FirstOnly(Sampler):
   ...     def ask(self):
   ...         return None

2. From an installed package, with no import needed: declare an entry point in the group
   ``quantune.samplers`` whose name is the sampler's name and whose object is the class::

       # the plugin's pyproject.toml
       [project.entry-points."quantune.samplers"]
       annealing = "my_plugin.samplers:AnnealingSampler"

   Entry points are looked up only when a config asks for a name that is not registered,
   and loaded then (so a broken plugin never slows down or breaks other runs). Names
   registered in code win over entry points of the same name. :func:`sampler_names` lists
   both, without loading any plugin.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, TypeVar

from quantune.errors import QuantuneError

if TYPE_CHECKING:
    from quantune.search.base import Sampler

ENTRY_POINT_GROUP = "quantune.samplers"

_SAMPLERS: dict[str, type[Sampler]] = {}
S = TypeVar("S", bound="type[Sampler]")


def register_sampler(name: str) -> Callable[[S], S]:
    """Class decorator that makes a sampler available under ``name``."""

    def decorate(cls: S) -> S:
        _SAMPLERS[name] = cls
        return cls

    return decorate


def _entry_points() -> list[EntryPoint]:
    return list(entry_points(group=ENTRY_POINT_GROUP))


def sampler_names() -> list[str]:
    """Registered samplers and installed plugins (entry points), sorted."""
    return sorted(set(_SAMPLERS) | {ep.name for ep in _entry_points()})


def get_sampler(name: str) -> type[Sampler]:
    """The class registered as ``name``, loading a plugin's entry point if need be."""
    if name in _SAMPLERS:
        return _SAMPLERS[name]
    from quantune.search.base import Sampler

    for ep in _entry_points():
        if ep.name != name:
            continue
        try:
            loaded = ep.load()
        except Exception as exc:
            raise QuantuneError(
                f"search.sampler: the plugin sampler '{name}' ({ep.value}) failed to load: {type(exc).__name__}: {exc}"
            ) from exc
        if not (isinstance(loaded, type) and issubclass(loaded, Sampler)):
            raise QuantuneError(
                f"search.sampler: the entry point '{name}' ({ep.value}) is {loaded!r}, not a quantune Sampler subclass"
            )
        _SAMPLERS[name] = loaded
        return loaded
    raise QuantuneError(f"search.sampler: unknown sampler '{name}'; choose one of {sampler_names()}")


def create_sampler(name: str, seed: int | None = 0, **options: Any) -> Sampler:
    """Instantiates the sampler registered as ``name``; unknown names list the known ones."""
    return get_sampler(name)(seed=seed, **options)
