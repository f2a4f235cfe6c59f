"""Search parameters.

A parameter answers one question: given the values already chosen for its parents, what may
it take? The answer is a *domain* (``domain_given(point)``), or ``None`` when the parameter
is inactive for that point (for example ``percentile`` when the calibration method is not
Percentile); an inactive parameter is left out of the point, so the pass uses its own default.

Domains (parameters without parents, each its own domain):

* :class:`Categorical` — one of a list of values, optionally weighted (priorities);
* :class:`~quantune.space.ranges.IntRange` / :class:`~quantune.space.ranges.FloatRange` —
  numeric ranges with optional step and log scale; a float range without step is continuous;
* :class:`Joint` — a tuple of coupled values that move together (iterations + learning rate).

:class:`Conditional` picks a domain from its parents' values. Every domain offers the same
small protocol, which the space and the samplers use and nothing else:

* ``parents`` (empty), ``finite`` (can it be listed?), ``size`` (``math.inf`` if not),
  ``weights`` (``None`` unless weighted);
* ``visit_order()`` — the values in the order exhaustive search visits them (highest weight
  first), as a lazy sequence;
* ``draw(rng)`` — one random value (weighted, log-uniform, ... as declared);
* ``choices_given(point)`` — the declared values (the pre-domain API, kept for callers that
  list values; continuous ranges raise ``TypeError``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from quantune.space._weights import check_weights, cumulative, draw_index, priority_order
from quantune.space.ranges import FloatRange, IntRange


@dataclass(frozen=True)
class Categorical:
    """One of a fixed list of values (strings, numbers, booleans, lists, None).

    ``weights`` (one positive number per choice) are priorities, as in AMD Quark: random
    sampling draws a choice in proportion to its weight, and exhaustive search visits higher
    weights first. Optuna's samplers have no notion of weights; quantune's Optuna adapter
    uses them by enqueueing the highest-priority point as the first trial.

    >>> Categorical(("MinMax", "Entropy", "Percentile"), weights=(3, 1, 1)).visit_order()
    ('MinMax', 'Entropy', 'Percentile')
    """

    choices: tuple[Any, ...]
    weights: tuple[float, ...] | None = None
    parents: tuple[str, ...] = field(default=(), init=False)
    finite: ClassVar[bool] = True
    _order: tuple[Any, ...] = field(default=(), init=False, repr=False, compare=False)
    _cum: tuple[float, ...] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        choices = tuple(self.choices)
        if not choices:
            raise ValueError("a categorical parameter needs at least one choice")
        weights = check_weights(self.weights, len(choices), "Categorical")
        object.__setattr__(self, "choices", choices)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "_order", tuple(choices[i] for i in priority_order(len(choices), weights)))
        object.__setattr__(self, "_cum", cumulative(weights))

    @property
    def size(self) -> int:
        return len(self.choices)

    def visit_order(self) -> tuple[Any, ...]:
        return self._order

    def draw(self, rng: random.Random) -> Any:
        return self.choices[draw_index(rng, len(self.choices), self._cum)]

    def choices_given(self, point: Mapping[str, Any]) -> tuple[Any, ...]:
        return self.choices

    def domain_given(self, point: Mapping[str, Any]) -> Categorical:
        return self


def Boolean(weights: tuple[float, float] | None = None) -> Categorical:
    """``False`` or ``True`` (weights, if given, in that order)."""
    return Categorical((False, True), weights)


@dataclass(frozen=True)
class Joint:
    """Coupled values that move together, e.g. iterations with the learning rate that suits them.

    The point holds one tuple under the joint parameter's own name; :func:`expand_joint`
    (or ``SearchSpace.expand``) turns it into one entry per name, for the code that applies
    the values. Samplers treat a joint as one categorical over its tuples (weights work as
    for :class:`Categorical`), so no sampler can ever split a pair.

    >>> Joint(("iterations", "lr"), [(100, 1e-4), (200, 1e-5)]).expand((200, 1e-5))
    {'iterations': 200, 'lr': 1e-05}
    """

    names: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]
    weights: tuple[float, ...] | None = None
    parents: tuple[str, ...] = field(default=(), init=False)
    finite: ClassVar[bool] = True
    _order: tuple[tuple[Any, ...], ...] = field(default=(), init=False, repr=False, compare=False)
    _cum: tuple[float, ...] | None = field(default=None, init=False, repr=False, compare=False)

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
        weights = check_weights(self.weights, len(values), f"Joint {names}")
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "_order", tuple(values[i] for i in priority_order(len(values), weights)))
        object.__setattr__(self, "_cum", cumulative(weights))

    @property
    def size(self) -> int:
        return len(self.values)

    def visit_order(self) -> tuple[tuple[Any, ...], ...]:
        return self._order

    def draw(self, rng: random.Random) -> tuple[Any, ...]:
        return self.values[draw_index(rng, len(self.values), self._cum)]

    def choices_given(self, point: Mapping[str, Any]) -> tuple[tuple[Any, ...], ...]:
        return self.values

    def domain_given(self, point: Mapping[str, Any]) -> Joint:
        return self

    def expand(self, value: Sequence[Any]) -> dict[str, Any]:
        """``{name: value}`` for one of this joint's tuples."""
        return dict(zip(self.names, value, strict=True))


Domain = Categorical | IntRange | FloatRange | Joint
DOMAIN_TYPES: tuple[type, ...] = (Categorical, IntRange, FloatRange, Joint)


@dataclass(frozen=True)
class Conditional:
    """A domain that depends on the values of one or more parent parameters.

    ``cases`` maps a tuple of parent values (one per parent, in order) to what the parameter
    may take for that combination: a list of values, or any domain (a weighted
    :class:`Categorical`, a range, a :class:`Joint`). A combination that is not listed makes
    the parameter inactive. Parents must be finite (they are branched on to count the space).

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
        """Every domain some parent combination leads to."""
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


__all__ = [
    "DOMAIN_TYPES",
    "Boolean",
    "Categorical",
    "Conditional",
    "Domain",
    "FloatRange",
    "IntRange",
    "Joint",
    "Param",
    "domains_of",
    "hashable",
]
