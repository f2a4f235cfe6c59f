"""A search space over named parameters, with lazy enumeration, exact sizes and random draws.

Parameters are kept parents first, so a conditional always sees its parents' values. Nothing
materialises the space: enumeration is a generator over lazy sequences, and the size is counted
by a dynamic programme that branches only on values later parameters depend on, so independent
conditionals cost a sum, not a product.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from quantune.errors import QuantuneError
from quantune.space.params import Domain, Joint, Param, domains_of, hashable

Point = dict[str, Any]
Constraint = Callable[[Mapping[str, Any]], bool]


def point_key(point: Mapping[str, Any]) -> str:
    """A canonical string for a point, used to tell points apart and as a cache key part."""
    return json.dumps(point, sort_keys=True, separators=(",", ":"), default=str)


class SearchSpace:
    """Named parameters plus rules (constraints) that a valid point must satisfy.

    ``fixed`` holds values of names outside the space that conditionals may depend on (the flow,
    say); they never appear in the points. Constraints see the point alone.

    >>> from quantune.space import Categorical, Conditional, IntRange
    >>> space = SearchSpace({
    ...     "method": Categorical(("MinMax", "Percentile")),
    ...     "percentile": Conditional.on("method", {"Percentile": [99.9, 99.99]}),
    ...     "samples": IntRange(16, 256, step=16),
    ... })
    >>> space.raw_size()  # (1 + 2) * 16
    48
    """

    def __init__(
        self,
        params: Mapping[str, Param],
        constraints: list[Constraint] | None = None,
        fixed: Mapping[str, Any] | None = None,
    ) -> None:
        self.fixed: dict[str, Any] = dict(fixed or {})
        self.params: dict[str, Param] = dict(_topological(params, self.fixed))
        self.constraints: list[Constraint] = list(constraints or [])
        self._structural = {parent for param in self.params.values() for parent in param.parents}
        self._check_structure()

    @property
    def names(self) -> list[str]:
        return list(self.params)

    def __len__(self) -> int:
        return len(self.params)

    def is_valid(self, point: Mapping[str, Any]) -> bool:
        return all(rule(point) for rule in self.constraints)

    def continuous_params(self) -> list[str]:
        """Names of the parameters that may take a continuous domain (no step), in order."""
        return [name for name, param in self.params.items() if not all(d.finite for d in domains_of(param))]

    def is_finite(self) -> bool:
        """Whether every point can be listed (no continuous parameter)."""
        return not self.continuous_params()

    def raw_size(self) -> int | float:
        """Points before constraints: an exact ``int``, or ``math.inf`` (a continuous parameter). Never enumerates."""
        names = self.names
        last_use: dict[str, int] = {}
        for index, name in enumerate(names):
            for parent in self.params[name].parents:
                if parent in self.params:
                    last_use[parent] = index
        # Each state: the parent values later parameters still need -> (that partial point, ways to reach it).
        states: dict[tuple[Any, ...], tuple[Point, int | float]] = {(): (dict(self.fixed), 1)}
        for index, name in enumerate(names):
            param = self.params[name]
            needed_later = last_use.get(name, -1) > index
            following: dict[tuple[Any, ...], tuple[Point, int | float]] = {}
            for key, (partial, count) in states.items():
                domain = param.domain_given(partial)
                if domain is None:
                    _add(following, key, partial, count)
                elif needed_later:
                    for value in domain.visit_order():
                        _add(following, (*key, (name, hashable(value))), {**partial, name: value}, count)
                else:
                    _add(following, key, partial, count * domain.size)
            done = {parent for parent in param.parents if last_use.get(parent) == index}
            states = _forget(following, done) if done else following
        total = sum(count for _, count in states.values())
        return math.inf if total == math.inf else int(total)

    def iterate(self) -> Iterator[Point]:
        """Every valid point once, lazily, depth first, each domain in its visit order."""
        continuous = self.continuous_params()
        if continuous:
            raise QuantuneError(
                f"cannot enumerate continuous parameters {continuous}: give each FloatRange a step, "
                "or search with a sampler that draws (random, tpe, cmaes, gp, qmc, nsga2)"
            )
        return self._walk()

    def _walk(self) -> Iterator[Point]:
        # An explicit stack: spaces with a parameter per operator would exceed the recursion limit.
        names = self.names
        params = [self.params[name] for name in names]
        count = len(names)
        fixed = self.fixed
        partial: Point = dict(fixed)
        values: list[Any] = [None] * count
        position = [0] * count
        index = 0
        descending = True
        while True:
            if descending:
                if index == count:
                    point = {k: v for k, v in partial.items() if k not in fixed} if fixed else dict(partial)
                    if self.is_valid(point):
                        yield point
                    descending = False
                    index -= 1
                    continue
                domain = params[index].domain_given(partial)
                if domain is None:
                    values[index] = None
                else:
                    values[index] = domain.visit_order()
                    position[index] = 0
                    partial[names[index]] = values[index][0]
                index += 1
                continue
            if index < 0:
                return
            sequence = values[index]
            if sequence is not None:
                position[index] += 1
                if position[index] < len(sequence):
                    partial[names[index]] = sequence[position[index]]
                    index += 1
                    descending = True
                    continue
                del partial[names[index]]
            index -= 1

    def sample(self, rng: random.Random) -> Point:
        """One point drawn per parameter (children after parents, weights honoured); may be invalid."""
        point: Point = {}
        context = dict(self.fixed) if self.fixed else point
        for name, param in self.params.items():
            domain = param.domain_given(context)
            if domain is not None:
                value = domain.draw(rng)
                point[name] = value
                if context is not point:
                    context[name] = value
        return point

    def domain_at(self, name: str, point: Mapping[str, Any]) -> Domain | None:
        """The domain ``name`` takes given the (partial) ``point``; ``None`` when inactive."""
        context = {**self.fixed, **point} if self.fixed else point
        return self.params[name].domain_given(context)

    def expand(self, point: Mapping[str, Any]) -> Point:
        """``point`` with every :class:`Joint` entry replaced by one entry per joint name."""
        expanded: Point = {}
        for name, value in point.items():
            domain = self.domain_at(name, point) if name in self.params else None
            if isinstance(domain, Joint):
                expanded.update(domain.expand(value))
            else:
                expanded[name] = value
        return expanded

    def _check_structure(self) -> None:
        owners: dict[str, str] = {}
        for name, param in self.params.items():
            domains = domains_of(param)
            if name in self._structural and not all(domain.finite for domain in domains):
                raise ValueError(f"parameter '{name}' is continuous but other parameters depend on it; give it a step")
            for member in {m for domain in domains if isinstance(domain, Joint) for m in domain.names}:
                clash = "a parameter" if member in self.params else "a fixed value" if member in self.fixed else None
                if clash or owners.get(member, name) != name:
                    other = clash or f"a member of joint '{owners[member]}'"
                    raise ValueError(f"joint '{name}' names '{member}', which is already {other}")
                owners[member] = name


def _add(
    states: dict[tuple[Any, ...], tuple[Point, int | float]], key: tuple[Any, ...], partial: Point, count: int | float
) -> None:
    if key in states:
        states[key] = (states[key][0], states[key][1] + count)
    else:
        states[key] = (partial, count)


def _forget(
    states: dict[tuple[Any, ...], tuple[Point, int | float]], names: set[str]
) -> dict[tuple[Any, ...], tuple[Point, int | float]]:
    """Drops parent values no later parameter needs, merging the states that become equal."""
    merged: dict[tuple[Any, ...], tuple[Point, int | float]] = {}
    for key, (partial, count) in states.items():
        kept = tuple(item for item in key if item[0] not in names)
        _add(merged, kept, {k: v for k, v in partial.items() if k not in names}, count)
    return merged


def _topological(params: Mapping[str, Param], fixed: Mapping[str, Any]) -> list[tuple[str, Param]]:
    """Orders parameters parents-first, keeping the given order otherwise; rejects cycles."""
    ordered: list[tuple[str, Param]] = []
    state: dict[str, str] = {}
    for name in params:
        if name in fixed:
            raise ValueError(f"'{name}' is both a searched parameter and a fixed value")

    def visit(name: str, trail: tuple[str, ...]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "active":
            cycle = " -> ".join((*trail, name))
            raise ValueError(f"conditional parameters form a cycle: {cycle}")
        if name not in params:
            if name in fixed:
                return
            raise ValueError(f"parameter '{trail[-1]}' depends on '{name}', which is not in the space")
        state[name] = "active"
        for parent in params[name].parents:
            visit(parent, (*trail, name))
        state[name] = "done"
        ordered.append((name, params[name]))

    for name in params:
        visit(name, ())
    return ordered
