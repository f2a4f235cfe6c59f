"""Search parameters.

A parameter answers: given the values chosen for its parents, what may it take? The answer is a
*domain* (``domain_given(point)``), or ``None`` when it is inactive for that point; an inactive
parameter is left out of the point, so the pass uses its own default. :class:`Conditional`
picks a domain from its parents' values. Every domain offers the small protocol the space and
samplers use: ``parents``, ``finite``, ``size`` (``math.inf`` if not finite), ``weights``,
``visit_order()`` (highest weight first, lazily), ``draw(rng)`` and ``choices_given(point)``
(continuous ranges raise ``TypeError``).
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, ClassVar

from quantune.space.ranges import FloatRange, IntRange


def check_weights(weights: Sequence[float] | None, count: int, what: str) -> tuple[float, ...] | None:
    """Validates weights against ``count`` values; ``None`` stays ``None`` (all values equal)."""
    if weights is None:
        return None
    values = tuple(float(weight) for weight in weights)
    if len(values) != count:
        raise ValueError(f"{what}: {len(values)} weights for {count} values; give one weight per value")
    for weight in values:
        if not math.isfinite(weight) or weight <= 0:
            # a zero weight: unreachable by random sampling, still visited by exhaustive search
            raise ValueError(f"{what}: weights must be finite and > 0, got {weight!r}; leave a value out instead")
    return values


class _Listed:
    """A domain listing its values (``_items``) by priority (weights: see :class:`Categorical`)."""

    finite: ClassVar[bool] = True
    _items: tuple[Any, ...]
    _order: tuple[Any, ...]
    _cum: tuple[float, ...] | None

    def _list(self, items: tuple[Any, ...], weights: tuple[float, ...] | None) -> None:
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "_items", items)
        order = range(len(items)) if weights is None else sorted(range(len(items)), key=lambda i: -weights[i])
        object.__setattr__(self, "_order", tuple(items[i] for i in order))
        object.__setattr__(self, "_cum", None if weights is None else tuple(accumulate(weights)))

    @property
    def size(self) -> int:
        return len(self._items)

    def visit_order(self) -> tuple[Any, ...]:
        return self._order

    def draw(self, rng: random.Random) -> Any:
        if self._cum is None:
            return self._items[rng.randrange(len(self._items))]
        return self._items[min(bisect.bisect_right(self._cum, rng.random() * self._cum[-1]), len(self._items) - 1)]

    def choices_given(self, point: Mapping[str, Any]) -> tuple[Any, ...]:
        return self._items

    def domain_given(self, point: Mapping[str, Any]) -> Any:
        return self


@dataclass(frozen=True)
class Categorical(_Listed):
    """One of a fixed list of values (strings, numbers, booleans, lists, None).

    ``weights`` are priorities, as in AMD Quark: random sampling draws in proportion to them,
    exhaustive search visits higher weights first, and the Optuna adapter enqueues the
    highest-priority point as the first trial.

    >>> Categorical(("MinMax", "Entropy", "Percentile"), weights=(3, 1, 1)).visit_order()
    ('MinMax', 'Entropy', 'Percentile')
    """

    choices: tuple[Any, ...]
    weights: tuple[float, ...] | None = None
    parents: tuple[str, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        choices = tuple(self.choices)
        if not choices:
            raise ValueError("a categorical parameter needs at least one choice")
        object.__setattr__(self, "choices", choices)
        self._list(choices, check_weights(self.weights, len(choices), "Categorical"))


def Boolean(weights: tuple[float, float] | None = None) -> Categorical:
    """``False`` or ``True`` (weights, if given, in that order)."""
    return Categorical((False, True), weights)


@dataclass(frozen=True)
class Joint(_Listed):
    """Coupled values that move together, e.g. iterations with the learning rate that suits them.

    The point holds one tuple under the joint's own name (``SearchSpace.expand`` splits it);
    samplers treat it as one categorical over its tuples, so no sampler can split a pair.

    >>> Joint(("iterations", "lr"), [(100, 1e-4), (200, 1e-5)]).expand((200, 1e-5))
    {'iterations': 200, 'lr': 1e-05}
    """

    names: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]
    weights: tuple[float, ...] | None = None
    parents: tuple[str, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        names = tuple(self.names)
        if not names or not all(isinstance(name, str) and name for name in names):
            raise ValueError(f"Joint: names must be a non-empty list of names, got {self.names!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"Joint: names repeat in {names}")
        values = tuple(tuple(value) for value in self.values)
        if not values:
            raise ValueError(f"Joint {names}: give at least one tuple of values")
        for value in values:
            if len(value) != len(names):
                raise ValueError(f"Joint {names}: {value!r} does not give one value per name")
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "values", values)
        self._list(values, check_weights(self.weights, len(values), f"Joint {names}"))

    def expand(self, value: Sequence[Any]) -> dict[str, Any]:
        return dict(zip(self.names, value, strict=True))


Domain = Categorical | IntRange | FloatRange | Joint
DOMAIN_TYPES: tuple[type, ...] = (Categorical, IntRange, FloatRange, Joint)


@dataclass(frozen=True)
class Conditional:
    """A domain that depends on the values of one or more parent parameters.

    ``cases`` maps a tuple of parent values (one per parent) to a list of values or a domain;
    an unlisted combination makes the parameter inactive. Parents must be finite (they are
    branched on to count the space).

    >>> Conditional(("activation_type", "quant_format"), {("int8", "QDQ"): (False, True)}).domain_given(
    ...     {"activation_type": "int8", "quant_format": "QOperator"}) is None
    True
    """

    parents: tuple[str, ...]
    cases: Mapping[tuple[Any, ...], Sequence[Any] | Domain]
    _domains: dict[Any, Domain] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parents", tuple(self.parents))
        if not self.parents:
            raise ValueError("a conditional parameter needs at least one parent")
        for combo, case in self.cases.items():
            if not isinstance(combo, tuple) or len(combo) != len(self.parents):
                raise ValueError(f"case {combo!r} does not give one value per parent {self.parents}")
            if isinstance(case, Conditional):
                raise TypeError(f"case {combo!r}: a case is a list of values or a domain, not a Conditional")
            domain = case if isinstance(case, DOMAIN_TYPES) else (Categorical(tuple(case)) if len(case) else None)
            if domain is not None:
                self._domains[hashable(combo)] = domain

    @classmethod
    def on(cls, parent: str, cases: Mapping[Any, Sequence[Any] | Domain]) -> Conditional:
        """Shorthand for a single parent: ``Conditional.on("method", {"Percentile": [99.9, 99.99]})``."""
        return cls(
            (parent,),
            {(value,): case if isinstance(case, DOMAIN_TYPES) else tuple(case) for value, case in cases.items()},
        )

    @property
    def finite(self) -> bool:
        return all(domain.finite for domain in self._domains.values())

    def domains(self) -> tuple[Domain, ...]:
        return tuple(self._domains.values())

    def domain_given(self, point: Mapping[str, Any]) -> Domain | None:
        if any(parent not in point for parent in self.parents):
            return None
        return self._domains.get(hashable(tuple(point[parent] for parent in self.parents)))

    def choices_given(self, point: Mapping[str, Any]) -> Sequence[Any]:
        domain = self.domain_given(point)
        return () if domain is None else domain.choices_given(point)


Param = Domain | Conditional


def domains_of(param: Param) -> tuple[Domain, ...]:
    """The domains a parameter can take, whatever its parents' values."""
    return param.domains() if isinstance(param, Conditional) else (param,)


def hashable(value: Any) -> Any:
    """``value`` with lists turned into tuples and dicts into sorted item tuples, so it can key a dict."""
    if isinstance(value, list | tuple):
        return tuple(hashable(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((key, hashable(item)) for key, item in value.items()))
    return value
