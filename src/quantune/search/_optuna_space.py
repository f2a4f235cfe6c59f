"""How a quantune space becomes Optuna suggestions.

Ranges become ``suggest_int`` / ``suggest_float``, so CMA-ES, GP and QMC see ordered numbers;
categoricals and joints ``suggest_categorical`` over the *indices* of their values, so any value
can be searched and a joint's values never split; a conditional is named with its parents'
values (``percentile|method='Percentile'``): Optuna wants one distribution per name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from quantune.space import Categorical, Domain, FloatRange, IntRange, Joint, Param, Point, SearchSpace


def label(name: str, param: Param, context: Mapping[str, Any]) -> str:
    """Optuna's name for ``name`` given its parents' values in ``context``."""
    if not param.parents:
        return name
    return name + "|" + ",".join(f"{parent}={context[parent]!r}" for parent in param.parents)


def suggest(trial: optuna.trial.Trial, name: str, domain: Domain) -> Any:
    """Asks ``trial`` for a value of ``domain`` under the Optuna name ``name``."""
    if isinstance(domain, IntRange):
        return trial.suggest_int(name, domain.low, domain.last, step=domain.step, log=domain.log)
    if isinstance(domain, FloatRange):
        if domain.step is None:
            return trial.suggest_float(name, domain.low, domain.high, log=domain.log)
        # Snap to the decimal grid so every sampler proposes the very same float for a grid point.
        return domain.snap(trial.suggest_float(name, domain.low, domain.last, step=domain.step))
    values = domain.choices_given({})
    return values[trial.suggest_categorical(name, list(range(len(values))))]


def suggest_point(trial: optuna.trial.Trial, space: SearchSpace) -> Point:
    """One point of ``space``, parents first, each value suggested by ``trial``."""
    point: Point = {}
    context = dict(space.fixed) if space.fixed else point
    for name, param in space.params.items():
        domain = param.domain_given(context)
        if domain is None:
            continue
        value = suggest(trial, label(name, param, context), domain)
        point[name] = value
        if context is not point:
            context[name] = value
    return point


def optuna_params(point: Point, space: SearchSpace) -> dict[str, Any]:
    """The Optuna parameters (name -> internal value) that reproduce ``point`` when enqueued."""
    params: dict[str, Any] = {}
    context = {**space.fixed, **point}
    for name, param in space.params.items():
        if name not in point:
            continue
        domain = param.domain_given(context)
        if domain is None:
            continue
        value = point[name]
        if not isinstance(domain, IntRange | FloatRange):
            value = _index(domain.choices_given({}), value)
        params[label(name, param, context)] = value
    return params


def _index(values: Sequence[Any], value: Any) -> int:
    """The position of ``value`` among ``values``, telling ``1`` from ``True`` as point keys do."""
    for index, candidate in enumerate(values):
        if candidate is value or (type(candidate) is type(value) and candidate == value):
            return index
    raise ValueError(f"{value!r} is not one of {list(values)!r}")


def priority_params(space: SearchSpace) -> dict[str, Any]:
    """Optuna parameters (name -> index) that fix every weighted parameter to its top value (a
    conditional whose parents are left to the sampler has no known name, so it is left too)."""
    fixed: dict[str, Any] = {}
    context: dict[str, Any] = dict(space.fixed)
    for name, param in space.params.items():
        domain = param.domain_given(context)
        if not isinstance(domain, Categorical | Joint) or domain.weights is None:
            continue
        top = domain.visit_order()[0]
        fixed[label(name, param, context)] = _index(domain.choices_given({}), top)
        context[name] = top
    return fixed
