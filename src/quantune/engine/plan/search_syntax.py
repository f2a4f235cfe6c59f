"""The YAML search syntax of ``passes:``: fixed values, ``search:`` domains, conditionals, joints, subsets.

Turns one ``passes[i]`` entry into a :class:`~quantune.engine.plan.step.Step` and its searched
parameters, checking every value against the pass's own config so a wrong value is reported
where it was written (``passes[1].params.per_channel.search``), never when a trial runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from quantune.config.loader import format_validation_error
from quantune.engine.plan.step import NodeLister, Step, subset_key
from quantune.errors import ConfigError
from quantune.passes import Pass, get_pass
from quantune.space import Boolean, Categorical, Conditional, FloatRange, IntRange, Joint, Param
from quantune.space.params import DOMAIN_TYPES, Domain


def build_step(index: int, entry: Any, provider: str, nodes: NodeLister | None) -> tuple[Step, dict[str, Param]]:
    where = f"passes[{index}]"
    pass_cls = get_pass(entry.name, field_name=f"{where}.name")
    fields = pass_cls.Config.model_fields
    fixed: dict[str, Any] = {}
    searched: dict[str, Param] = {}
    subsets: dict[str, tuple[str, ...]] = {}
    for name, value in entry.params.items():
        if name not in fields:
            raise ConfigError(
                f"{where}.params.{name}: unknown parameter of pass '{entry.name}'; allowed: {', '.join(fields)}"
            )
        if isinstance(value, dict) and "search" in value:
            if set(value) != {"search"}:
                raise ConfigError(f"{where}.params.{name}: a searched parameter takes only 'search'")
            spec = value["search"]
            if isinstance(spec, dict) and "subset_of" in spec:
                subsets[name] = _subset_elements(spec, f"{where}.params.{name}.search", nodes)
            else:
                searched[name] = _parse_search(spec, f"{where}.params.{name}.search")
        else:
            fixed[name] = value
    try:
        pass_cls.Config.model_validate(fixed)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, prefix=f"{where}.params")) from None
    coupled = {member for spec in entry.joint for member in spec.params}
    default_joints: dict[str, Joint] = {}
    if entry.search:
        for name, param in pass_cls.search_space.items():
            if isinstance(param, Joint):  # a default joint (e.g. num_iter_lr), unless a member is given
                if not set(param.names) & ({*fixed, *searched, *coupled, *subsets}):
                    default_joints[name] = param
            elif name not in fixed and name not in searched and name not in coupled:
                searched[name] = param
    allowed = pass_cls.provider_rules.get(provider, {})
    context = {**{name: field.default for name, field in fields.items()}, **fixed}
    params: dict[str, Param] = {}
    for name, param in searched.items():
        for value in _values(param):  # each searched value valid on its own (combinations may be pruned)
            _check_values(pass_cls, fixed, {name: value}, f"{where}.params.{name}")
        resolved = _resolve(_restrict(param, allowed.get(name)), entry.step_id, context, searched)
        if resolved is not None:
            params[f"{entry.step_id}.{name}"] = resolved
    for name, elements in subsets.items():
        for element in elements:
            params[subset_key(entry.step_id, name, element)] = Boolean()
    joints: dict[str, tuple[str, ...]] = {}
    for position, spec in enumerate(entry.joint):
        where_joint = f"{where}.joint[{position}]"
        members = tuple(spec.params)
        for member in members:
            if member not in fields:
                raise ConfigError(f"{where_joint}.params: '{member}' is not a parameter of '{entry.name}'")
            if member in entry.params:
                raise ConfigError(f"{where_joint}.params: '{member}' is also given in params; give it in one place")
        try:
            joint = Joint(members, [tuple(v) for v in spec.values], tuple(spec.weights) if spec.weights else None)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{where_joint}: {exc}") from None
        for value in joint.values:
            _check_values(pass_cls, fixed, dict(zip(members, value, strict=True)), where_joint)
        name = "+".join(members)
        joints[name] = members
        params[f"{entry.step_id}.{name}"] = joint
    for name, joint in default_joints.items():
        joints[name] = joint.names
        params[f"{entry.step_id}.{name}"] = joint
    return Step(entry.step_id, pass_cls, fixed, subsets, joints), params


def _subset_elements(spec: dict[str, Any], where: str, nodes: NodeLister | None) -> tuple[str, ...]:
    """``subset_of: [names]`` or ``subset_of: {op_types: [Conv, ...]}`` (the model's nodes of those types)."""
    if set(spec) != {"subset_of"}:
        raise ConfigError(f"{where}: subset_of takes no other keys")
    source = spec["subset_of"]
    if isinstance(source, list) and source and all(isinstance(item, str) for item in source):
        return tuple(source)
    if isinstance(source, dict) and set(source) == {"op_types"} and isinstance(source["op_types"], list):
        if nodes is None:
            raise ConfigError(f"{where}: subset_of by op_types needs the model")
        wanted = set(source["op_types"])
        found = tuple(name for name, op_type in nodes() if op_type in wanted)
        if not found:
            raise ConfigError(f"{where}: the model has no nodes of types {sorted(wanted)}")
        return found
    raise ConfigError(f"{where}.subset_of: give a list of node names, or {{op_types: [Conv, MatMul, ...]}}")


_SEARCH_FORMS = (
    "a list of values; {values: [...], weights: [...]}; {int: [low, high], step: 1, log: false}; "
    "{float: [low, high], step: null, log: false}; or {when: <parameter>, cases: {<parent value>: <any of these>}}"
)


def _parse_search(spec: Any, where: str) -> Param:
    if isinstance(spec, dict) and "when" in spec:
        if set(spec) != {"when", "cases"} or not isinstance(spec["cases"], dict):
            raise ConfigError(f"{where}: a conditional takes 'when' and 'cases' only")
        when = spec["when"]
        parents = [when] if isinstance(when, str) else when
        if not isinstance(parents, list) or not parents or not all(isinstance(p, str) for p in parents):
            raise ConfigError(f"{where}.when: name a parameter of the same pass, or a list of them")
        cases: dict[tuple[Any, ...], Any] = {}
        for key, case in spec["cases"].items():
            combo = (key,) if len(parents) == 1 else tuple(part.strip() for part in str(key).split(","))
            if len(combo) != len(parents):
                raise ConfigError(
                    f"{where}.cases.{key}: give one value per parameter of 'when' {parents}, "
                    f"separated by commas (e.g. '{', '.join('<' + p + '>' for p in parents)}')"
                )
            cases[combo] = _parse_domain(case, f"{where}.cases.{key}")
        return Conditional(tuple(parents), cases)
    return _parse_domain(spec, where)


def _parse_domain(spec: Any, where: str) -> Domain:
    try:
        if isinstance(spec, list):
            if not spec:
                raise ConfigError(f"{where}: give at least one value to search")
            return Categorical(tuple(spec))
        if isinstance(spec, dict) and "values" in spec and set(spec) <= {"values", "weights"}:
            weights = spec.get("weights")
            return Categorical(tuple(spec["values"]), tuple(weights) if weights is not None else None)
        numeric = {"int", "float"} & set(spec) if isinstance(spec, dict) else set()
        if len(numeric) == 1 and set(spec) <= {*numeric, "step", "log"}:
            kind = numeric.pop()
            bounds = spec[kind]
            if not isinstance(bounds, list) or len(bounds) != 2:
                raise ConfigError(f"{where}.{kind}: give [low, high]")
            log = bool(spec.get("log", False))
            if kind == "int":
                return IntRange(bounds[0], bounds[1], step=spec.get("step") or 1, log=log)
            return FloatRange(bounds[0], bounds[1], step=spec.get("step"), log=log)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    raise ConfigError(f"{where}: expected {_SEARCH_FORMS}")


def _domain_values(domain: Domain) -> list[Any]:
    """The values to check a domain with: all of a categorical, the ends of a range."""
    if isinstance(domain, IntRange | FloatRange):
        return [domain.low, domain.last if domain.finite else domain.high]
    return list(domain.choices_given({}))


def _values(param: Param) -> list[Any]:
    domains = param.domains() if isinstance(param, Conditional) else (param,)
    return [value for domain in domains for value in _domain_values(domain)]


def _check_values(pass_cls: type[Pass], fixed: dict[str, Any], values: dict[str, Any], where: str) -> None:
    try:
        pass_cls.Config.model_validate({**fixed, **values})
    except ValidationError as exc:
        own = [error for error in exc.errors() if error["loc"][:1] and error["loc"][0] in values]
        if own:
            shown = values if len(values) > 1 else next(iter(values.values()))
            raise ConfigError(f"{where}: value {shown!r} is not allowed: {own[0]['msg']}") from None


def _restrict(param: Param, allowed: tuple[Any, ...] | None) -> Param:
    """Keeps only the values the target provider supports."""
    if allowed is None:
        return param
    if isinstance(param, Categorical):
        kept = tuple(value for value in param.choices if value in allowed)
        return Categorical(kept) if kept else Categorical((allowed[0],))
    if isinstance(param, Conditional):
        cases: dict[tuple[Any, ...], Any] = {}
        for combo, case in param.cases.items():
            if isinstance(case, DOMAIN_TYPES):
                cases[combo] = _restrict(case, allowed)
            elif kept := tuple(value for value in case if value in allowed):
                cases[combo] = kept
        return Conditional(param.parents, cases)
    return param


def _resolve(param: Param, step_id: str, context: Mapping[str, Any], searched: Mapping[str, Param]) -> Param | None:
    """Prefixes a conditional's parents with the step id, and settles the parents that are
    fixed: only the cases matching their values remain (none left: the parameter is inactive)."""
    if not isinstance(param, Conditional):
        return param
    for parent in param.parents:
        if parent not in context:
            raise ConfigError(
                f"passes.{step_id}: 'when: {parent}' names no parameter of this pass; its parameters: {list(context)}"
            )
    free = [index for index, parent in enumerate(param.parents) if parent in searched]
    cases: dict[tuple[Any, ...], Any] = {}
    for combo, case in param.cases.items():
        if not all(_same(context.get(parent), combo[i]) for i, parent in enumerate(param.parents) if i not in free):
            continue  # a fixed parent has another value
        choices = []
        for i in free:
            parent = param.parents[i]
            parent_values = _values(searched[parent])
            matches = [value for value in parent_values if _same(value, combo[i])]
            if not matches:
                raise ConfigError(
                    f"passes.{step_id}: case '{combo[i]}' is not a value of '{parent}' (its values: {parent_values})"
                )
            choices.append(matches)
        for values in itertools.product(*choices):
            cases[tuple(values)] = case
    if not free:  # every parent fixed: the parameter is the matching case's domain, or inactive
        case = cases.get(())
        if case is None or isinstance(case, DOMAIN_TYPES):
            return case
        return Categorical(tuple(case)) if len(case) else None
    return Conditional(tuple(f"{step_id}.{param.parents[i]}" for i in free), cases)


def _same(value: Any, key: Any) -> bool:
    """A parent's value against a case key from YAML/JSON (``"0.5"``, ``"true"`` and ``true`` alike)."""
    if value == key:
        return True
    text = str(value)
    return text == str(key) or (isinstance(value, bool) and text.lower() == str(key).lower())
