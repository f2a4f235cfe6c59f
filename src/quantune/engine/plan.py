"""From config to plan: the flow's steps, the search space over their parameters, and the
rules that keep invalid points out.

Parameter names in the space are ``<step id>.<parameter>``. Each pass's config validators
become constraints of the space, so a point onnxruntime cannot run is never proposed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from quantune.config import Config
from quantune.config.loader import format_validation_error
from quantune.errors import ConfigError
from quantune.passes import Pass, PassConfig, get_pass
from quantune.space import Categorical, Conditional, Param, Point, SearchSpace


@dataclass(frozen=True)
class Step:
    """One pass of the flow with the parameter values the user fixed."""

    id: str
    pass_cls: type[Pass]
    fixed: Mapping[str, Any]
    searched: tuple[str, ...]

    def config_for(self, point: Mapping[str, Any]) -> PassConfig:
        values = dict(self.fixed)
        for name in self.searched:
            key = f"{self.id}.{name}"
            if key in point:
                values[name] = point[key]
        return self.pass_cls.Config.model_validate(values)


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    space: SearchSpace

    @property
    def flow(self) -> list[str]:
        return [step.id for step in self.steps]

    def configs_for(self, point: Mapping[str, Any]) -> list[tuple[Step, PassConfig]]:
        return [(step, step.config_for(point)) for step in self.steps]

    def is_runnable(self, point: Mapping[str, Any]) -> bool:
        try:
            self.configs_for(point)
        except ValidationError:
            return False
        return True


def build_plan(config: Config) -> Plan:
    steps: list[Step] = []
    params: dict[str, Param] = {}
    for index, entry in enumerate(config.passes):
        where = f"passes[{index}]"
        pass_cls = get_pass(entry.name, field_name=f"{where}.name")
        fields = pass_cls.Config.model_fields
        fixed: dict[str, Any] = {}
        searched: dict[str, Param] = {}
        for name, value in entry.params.items():
            if name not in fields:
                raise ConfigError(
                    f"{where}.params.{name}: unknown parameter of pass '{entry.name}'; allowed: {', '.join(fields)}"
                )
            if isinstance(value, dict) and "search" in value:
                if set(value) != {"search"}:
                    raise ConfigError(f"{where}.params.{name}: a searched parameter takes only 'search'")
                searched[name] = _parse_search(value["search"], f"{where}.params.{name}.search", searched)
            else:
                fixed[name] = value
        _validate_fixed(pass_cls, fixed, f"{where}.params")
        if entry.search:
            for name, param in pass_cls.search_space.items():
                if name not in fixed and name not in searched:
                    searched[name] = param
        defaults = {name: field.default for name, field in fields.items()}
        context = {**defaults, **fixed}
        step_params: dict[str, Param] = {}
        for name, param in searched.items():
            _check_choices(pass_cls, fixed, name, param, f"{where}.params.{name}")
            resolved = _resolve(param, entry.step_id, context, searched)
            if resolved is not None:
                step_params[f"{entry.step_id}.{name}"] = resolved
        steps.append(Step(entry.step_id, pass_cls, fixed, tuple(searched)))
        params.update(step_params)
    plan_steps = tuple(steps)
    try:
        space = SearchSpace(params)
    except ValueError as exc:
        raise ConfigError(f"passes: {exc}") from None
    plan = Plan(plan_steps, space)
    space.constraints.append(plan.is_runnable)
    return plan


def _parse_search(spec: Any, where: str, siblings: Mapping[str, Param]) -> Param:
    if isinstance(spec, list):
        if not spec:
            raise ConfigError(f"{where}: give at least one value to search")
        return Categorical(tuple(spec))
    if isinstance(spec, dict) and set(spec) == {"when", "cases"} and isinstance(spec["cases"], dict):
        parent = spec["when"]
        if not isinstance(parent, str):
            raise ConfigError(f"{where}.when: name one parameter of the same pass")
        cases = {}
        for key, values in spec["cases"].items():
            if not isinstance(values, list) or not values:
                raise ConfigError(f"{where}.cases.{key}: give a non-empty list of values")
            cases[key] = tuple(values)
        return Conditional.on(parent, cases)
    raise ConfigError(
        f"{where}: expected a list of values, or {{when: <parameter>, cases: {{<parent value>: [values]}}}}"
    )


def _validate_fixed(pass_cls: type[Pass], fixed: dict[str, Any], where: str) -> None:
    try:
        pass_cls.Config.model_validate(fixed)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, prefix=where)) from None


def _check_choices(pass_cls: type[Pass], fixed: dict[str, Any], name: str, param: Param, where: str) -> None:
    """Each searched value must be valid for its field on its own (combinations may still be pruned)."""
    values = param.choices if isinstance(param, Categorical) else [v for c in param.cases.values() for v in c]
    for value in values:
        try:
            pass_cls.Config.model_validate({**fixed, name: value})
        except ValidationError as exc:
            own = [error for error in exc.errors() if error["loc"][:1] == (name,)]
            if own:
                raise ConfigError(f"{where}: value {value!r} is not allowed: {own[0]['msg']}") from None


def _resolve(param: Param, step_id: str, context: Mapping[str, Any], searched: Mapping[str, Param]) -> Param | None:
    """Prefixes a conditional's parents with the step id, or settles it when its parent is fixed."""
    if isinstance(param, Categorical):
        return param
    parent = param.parents[0]
    if parent not in searched:
        choices = param.choices_given({parent: context.get(parent)})
        return Categorical(choices) if choices else None
    parent_param = searched[parent]
    parent_values = (
        parent_param.choices
        if isinstance(parent_param, Categorical)
        else [v for c in parent_param.cases.values() for v in c]
    )
    cases = {}
    for (key,), choices in param.cases.items():
        matches = [value for value in parent_values if value == key or str(value) == str(key)]
        if not matches:
            raise ConfigError(
                f"passes.{step_id}: case '{key}' is not a value of '{parent}' (its values: {list(parent_values)})"
            )
        for match in matches:
            cases[(match,)] = choices
    return Conditional((f"{step_id}.{parent}",), cases)


def describe_point(point: Point) -> str:
    return ", ".join(f"{name}={value}" for name, value in point.items()) or "(defaults)"
