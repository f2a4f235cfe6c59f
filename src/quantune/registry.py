"""One shape for every "find it by name" table: passes, samplers, strategies and metrics.

A name comes from code (the kind's decorator, or the class's ``name``) or from an installed
package's entry point in the kind's group (``quantune.passes``, ``quantune.samplers``,
``quantune.strategies``, ``quantune.metrics``). Entry points load only when a name is not
registered, so a broken plugin never breaks a run that does not ask for it; code wins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar, overload

from quantune.errors import QuantuneError

T = TypeVar("T")


class Registry(Generic[T]):
    """Things of one ``kind`` by name, from code and from the entry point ``group``.

    ``accepts`` says whether a loaded entry point's object is of the right kind; ``expected``
    names that kind in the error a wrong object gets. ``field`` is the config field that
    names things of this kind, so an unknown name is reported where the user wrote it.
    """

    def __init__(self, kind: str, group: str, *, field: str, accepts: Callable[[object], bool], expected: str) -> None:
        self.kind = kind
        self.group = group
        self.field = field
        self._accepts = accepts
        self._expected = expected
        self._items: dict[str, T] = {}
        self._plugins: dict[str, str] = {}  # name -> "module:object@version" of loaded entry points

    def add(self, name: str, item: T) -> T:
        """Registers ``item`` as ``name`` (a later registration of the same name replaces it)."""
        self._items[name] = item
        return item

    @overload
    def decorator(self, name_or_item: str) -> Callable[[T], T]: ...
    @overload
    def decorator(self, name_or_item: T) -> T: ...
    def decorator(self, name_or_item: Any) -> Any:
        """``@register(cls)`` (name from ``cls.name``) or ``@register("name")``."""
        if isinstance(name_or_item, str):
            name = name_or_item
            return lambda item: self.add(name, item)
        name = getattr(name_or_item, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"{name_or_item!r} has no 'name' to register it under; pass the name to the decorator")
        return self.add(name, name_or_item)

    def _entry_points(self) -> list[EntryPoint]:
        return list(entry_points(group=self.group))

    def names(self) -> list[str]:
        """Registered names and installed plugins' names, sorted; no plugin is loaded."""
        return sorted(set(self._items) | {ep.name for ep in self._entry_points()})

    def registered(self) -> dict[str, T]:
        """What code registered (plugins only once they were asked for by name)."""
        return dict(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items or any(ep.name == name for ep in self._entry_points())

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def find(self, name: str, *, field_name: str | None = None) -> T | None:
        """The thing named ``name``, loading its plugin if need be; None if there is none."""
        if name in self._items:
            return self._items[name]
        where = field_name or self.field
        for ep in self._entry_points():
            if ep.name != name:
                continue
            try:
                loaded = ep.load()
            except Exception as exc:
                raise QuantuneError(
                    f"{where}: the plugin {self.kind} '{name}' ({ep.value}) failed to load: {type(exc).__name__}: {exc}"
                ) from exc
            if not self._accepts(loaded):
                raise QuantuneError(
                    f"{where}: the entry point '{name}' ({ep.value}) is {loaded!r}, not {self._expected}"
                )
            self._items[name] = loaded
            self._plugins[name] = f"{ep.value}@{ep.dist.version if ep.dist is not None else '?'}"
            return loaded
        return None

    def get(self, name: str, *, field_name: str | None = None) -> T:
        """The thing named ``name``; an unknown name is one error listing the known ones."""
        found = self.find(name, field_name=field_name)
        if found is None:
            raise QuantuneError(
                f"{field_name or self.field}: unknown {self.kind} '{name}'; choose one of {self.names()}"
            )
        return found

    def source(self, name: str) -> str | None:
        """Where a loaded plugin came from (``module:object@version``), for cache keys; None for code."""
        return self._plugins.get(name)
