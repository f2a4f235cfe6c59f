"""Search parameters.

A parameter answers one question: given the values already chosen for its parents, which
values may it take? An empty answer means the parameter is inactive for that point (for
example ``percentile`` when the calibration method is not Percentile); an inactive parameter
is left out of the point, so the pass uses its own default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Categorical:
    """One of a fixed list of values (strings, numbers, booleans, lists, None)."""

    choices: tuple[Any, ...]
    parents: tuple[str, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError("a categorical parameter needs at least one choice")

    def choices_given(self, point: Mapping[str, Any]) -> tuple[Any, ...]:
        return self.choices


def Boolean() -> Categorical:
    """``False`` or ``True``."""
    return Categorical((False, True))


@dataclass(frozen=True)
class Conditional:
    """Choices that depend on the values of one or more parent parameters.

    ``cases`` maps a tuple of parent values (one per parent, in order) to the choices for that
    combination. A combination that is not listed makes the parameter inactive.
    """

    parents: tuple[str, ...]
    cases: Mapping[tuple[Any, ...], tuple[Any, ...]]

    def __post_init__(self) -> None:
        if not self.parents:
            raise ValueError("a conditional parameter needs at least one parent")
        for combo in self.cases:
            if len(combo) != len(self.parents):
                raise ValueError(f"case {combo!r} does not give one value per parent {self.parents}")

    @classmethod
    def on(cls, parent: str, cases: Mapping[Any, Sequence[Any]]) -> Conditional:
        """Shorthand for a single parent: ``Conditional.on("method", {"Percentile": [99.9, 99.99]})``."""
        return cls((parent,), {(value,): tuple(choices) for value, choices in cases.items()})

    def choices_given(self, point: Mapping[str, Any]) -> tuple[Any, ...]:
        if any(parent not in point for parent in self.parents):
            return ()
        combo = tuple(point[parent] for parent in self.parents)
        return tuple(self.cases.get(_hashable(combo), ()))


Param = Categorical | Conditional


def _hashable(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_hashable(item) for item in value)
    return value
