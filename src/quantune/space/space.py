"""A search space over named parameters, with lazy enumeration, exact sizes and random draws.

Parameters are kept in an order where every parent comes before its children, so a point is
built front to back and a conditional parameter always sees its parents' values. Nothing
here ever materialises the space: enumeration is a generator, and the size is counted by
branching only on the parameters that other parameters depend on.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from quantune.space.params import Param

Point = dict[str, Any]
Constraint = Callable[[Mapping[str, Any]], bool]


def point_key(point: Mapping[str, Any]) -> str:
    """A canonical string for a point, used to tell points apart and as a cache key part."""
    return json.dumps(point, sort_keys=True, separators=(",", ":"), default=str)


class SearchSpace:
    """Named parameters plus rules (constraints) that a valid point must satisfy."""

    def __init__(self, params: Mapping[str, Param], constraints: list[Constraint] | None = None) -> None:
        self.params: dict[str, Param] = dict(_topological(params))
        self.constraints: list[Constraint] = list(constraints or [])
        self._structural = {parent for param in self.params.values() for parent in param.parents}

    @property
    def names(self) -> list[str]:
        return list(self.params)

    def __len__(self) -> int:
        return len(self.params)

    def is_valid(self, point: Mapping[str, Any]) -> bool:
        return all(rule(point) for rule in self.constraints)

    def raw_size(self) -> int:
        """Number of points before constraints (conditionals already respected)."""

        def count(index: int, partial: Point) -> int:
            if index == len(names):
                return 1
            name = names[index]
            choices = self.params[name].choices_given(partial)
            if not choices:
                return count(index + 1, partial)
            if name not in self._structural:
                return len(choices) * count(index + 1, partial)
            return sum(count(index + 1, {**partial, name: value}) for value in choices)

        names = self.names
        return count(0, {})

    def iterate(self) -> Iterator[Point]:
        """Every valid point once, in a fixed order (depth first over the parameter order)."""
        names = self.names

        def walk(index: int, partial: Point) -> Iterator[Point]:
            if index == len(names):
                if self.is_valid(partial):
                    yield dict(partial)
                return
            name = names[index]
            choices = self.params[name].choices_given(partial)
            if not choices:
                yield from walk(index + 1, partial)
                return
            for value in choices:
                partial[name] = value
                yield from walk(index + 1, partial)
            del partial[name]

        yield from walk(0, {})

    def sample(self, rng: random.Random) -> Point:
        """One point drawn uniformly per parameter (children after parents); may be invalid."""
        point: Point = {}
        for name, param in self.params.items():
            choices = param.choices_given(point)
            if choices:
                point[name] = choices[rng.randrange(len(choices))]
        return point


def _topological(params: Mapping[str, Param]) -> list[tuple[str, Param]]:
    """Orders parameters parents-first, keeping the given order otherwise; rejects cycles."""
    ordered: list[tuple[str, Param]] = []
    state: dict[str, str] = {}

    def visit(name: str, trail: tuple[str, ...]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "active":
            cycle = " -> ".join((*trail, name))
            raise ValueError(f"conditional parameters form a cycle: {cycle}")
        if name not in params:
            raise ValueError(f"parameter '{trail[-1]}' depends on '{name}', which is not in the space")
        state[name] = "active"
        for parent in params[name].parents:
            visit(parent, (*trail, name))
        state[name] = "done"
        ordered.append((name, params[name]))

    for name in params:
        visit(name, ())
    return ordered
