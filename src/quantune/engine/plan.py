"""From config to plan: the steps, the flows through them, and one search space over all.

Parameter names in the space are ``<step id>.<parameter>``. With several flows the space has
a ``flow`` parameter, and each step's parameters are active only in the flows that contain
the step. Flows that share a prefix share its work through the content-addressed cache: the
same input model and pass config is one cache entry, however many flows pass through it.

Invalid points are pruned three ways, all as constraints of the space so none is ever run:
each pass's config validators (what onnxruntime cannot do), the target execution provider's
rules, and the user's ``rules``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from quantune.config import Config
from quantune.config.loader import format_validation_error
from quantune.errors import ConfigError
from quantune.passes import Pass, PassConfig, get_pass
from quantune.space import Boolean, Categorical, Conditional, Param, Point, SearchSpace

FLOW = "flow"


@dataclass(frozen=True)
class Step:
    """One pass instance with the parameter values the user fixed.

    ``subsets`` maps a list-valued parameter (e.g. ``nodes_to_exclude``) to the elements
    searched one boolean each: the point holds ``<step>.<param>[<element>]`` flags, and the
    pass receives the list of elements whose flag is set.
    """

    id: str
    pass_cls: type[Pass]
    fixed: Mapping[str, Any]
    searched: tuple[str, ...]
    subsets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def config_for(self, point: Mapping[str, Any]) -> PassConfig:
        """The pass config for ``point``: fixed values, overridden by any ``<step>.<param>`` the
        point holds (searched by a sampler, or set by a strategy such as an op fallback)."""
        values = dict(self.fixed)
        prefix = f"{self.id}."
        fields = self.pass_cls.Config.model_fields
        for key, value in point.items():
            if key.startswith(prefix) and key[len(prefix) :] in fields:
                values[key[len(prefix) :]] = value
        for name, elements in self.subsets.items():
            chosen = [element for element in elements if point.get(subset_key(self.id, name, element))]
            values[name] = [*values.get(name, []), *chosen]
        return self.pass_cls.Config.model_validate(values)


def subset_key(step_id: str, param: str, element: str) -> str:
    return f"{step_id}.{param}[{element}]"


@dataclass(frozen=True)
class Plan:
    steps: Mapping[str, Step]
    flows: Mapping[str, tuple[str, ...]]
    step_params: Mapping[str, Mapping[str, Param]]
    space: SearchSpace
    rules: tuple[Any, ...] = ()

    @property
    def flow(self) -> list[str]:
        """The steps of the only flow (or of the first, when there are several)."""
        return list(next(iter(self.flows.values())))

    def flow_of(self, point: Mapping[str, Any]) -> tuple[str, ...]:
        if len(self.flows) == 1:
            return next(iter(self.flows.values()))
        return self.flows[point[FLOW]]

    def configs_for(
        self, point: Mapping[str, Any], flow: tuple[str, ...] | None = None
    ) -> list[tuple[Step, PassConfig]]:
        steps = flow if flow is not None else self.flow_of(point)
        return [(self.steps[step_id], self.steps[step_id].config_for(point)) for step_id in steps]

    def is_runnable(self, point: Mapping[str, Any]) -> bool:
        try:
            self.configs_for(point)
        except (ValidationError, KeyError):
            return False
        return all(rule(point) for rule in self.rules)

    def subspace(self, step_ids: list[str], fixed: Mapping[str, Any] | None = None) -> SearchSpace:
        """The space of ``step_ids``' own parameters; ``fixed`` holds earlier steps' chosen values."""
        fixed = dict(fixed or {})
        params: dict[str, Param] = {}
        for step_id in step_ids:
            params.update(self.step_params[step_id])
        steps = tuple(step_ids)

        def runnable(point: Mapping[str, Any]) -> bool:
            full = {**fixed, **point}
            try:
                self.configs_for(full, flow=steps)
            except (ValidationError, KeyError):
                return False
            return all(rule(full) for rule in self.rules)

        return SearchSpace(params, [runnable])

    def flow_space(self, name: str) -> SearchSpace:
        """The space of one flow, for reports (``quantune space``)."""
        return self.subspace(list(self.flows[name]), {FLOW: name} if len(self.flows) > 1 else {})


NodeLister = Callable[[], list[tuple[str, str]]]


def build_plan(config: Config, nodes: NodeLister | None = None) -> Plan:
    """``nodes`` lists the input model's (name, op type) pairs, for ``subset_of`` searches."""
    steps: dict[str, Step] = {}
    step_params: dict[str, dict[str, Param]] = {}
    provider = config.target.provider
    for index, entry in enumerate(config.passes):
        step, params = _build_step(index, entry, provider, nodes)
        steps[step.id] = step
        step_params[step.id] = params
    flows = _flows(config, steps, provider)
    space_params: dict[str, Param] = {}
    if len(flows) > 1:
        space_params[FLOW] = Categorical(tuple(flows))
    for step_id, params in step_params.items():
        using = tuple(name for name, flow in flows.items() if step_id in flow)
        if not using:
            continue
        for name, param in params.items():
            space_params[name] = _gate(param, using) if len(flows) > 1 else param
    rules = tuple(_rule(index, rule, space_params) for index, rule in enumerate(config.rules))
    try:
        space = SearchSpace(space_params)
    except ValueError as exc:
        raise ConfigError(f"passes: {exc}") from None
    plan = Plan(steps, flows, step_params, space, rules)
    space.constraints.append(plan.is_runnable)
    return plan


def _build_step(index: int, entry: Any, provider: str, nodes: NodeLister | None) -> tuple[Step, dict[str, Param]]:
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
    if entry.search:
        for name, param in pass_cls.search_space.items():
            if name not in fixed and name not in searched:
                searched[name] = param
    allowed = pass_cls.provider_rules.get(provider, {})
    context = {**{name: field.default for name, field in fields.items()}, **fixed}
    params: dict[str, Param] = {}
    for name, param in searched.items():
        _check_choices(pass_cls, fixed, name, param, f"{where}.params.{name}")
        resolved = _resolve(_restrict(param, allowed.get(name)), entry.step_id, context, searched)
        if resolved is not None:
            params[f"{entry.step_id}.{name}"] = resolved
    for name, elements in subsets.items():
        for element in elements:
            params[subset_key(entry.step_id, name, element)] = Boolean()
    return Step(entry.step_id, pass_cls, fixed, tuple(searched), subsets), params


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


def _flows(config: Config, steps: Mapping[str, Step], provider: str) -> dict[str, tuple[str, ...]]:
    raw = config.flows
    if raw is None:
        paths = [tuple(steps)]
    elif isinstance(raw, dict):
        paths = list(_tree_paths(raw, ()))
    else:
        paths = [tuple(flow) for flow in raw]
    flows: dict[str, tuple[str, ...]] = {}
    for index, path in enumerate(paths):
        if not path:
            raise ConfigError(f"flows[{index}]: a flow needs at least one pass")
        for step_id in path:
            if step_id not in steps:
                raise ConfigError(f"flows[{index}]: no pass with id '{step_id}'; pass ids are {list(steps)}")
        unsupported = [s for s in path if steps[s].pass_cls.providers and provider not in steps[s].pass_cls.providers]
        if unsupported:
            continue  # pruned: the target cannot run this flow's output
        flows[">".join(path)] = path
    if not flows:
        raise ConfigError(f"target.provider: no flow can run on '{provider}'")
    return flows


def _tree_paths(tree: Mapping[str, Any], prefix: tuple[str, ...]):
    for step_id, children in tree.items():
        path = (*prefix, step_id)
        if children:
            if not isinstance(children, dict):
                raise ConfigError(f"flows: the children of '{step_id}' must be a mapping (or empty)")
            yield from _tree_paths(children, path)
        else:
            yield path


def _parse_search(spec: Any, where: str) -> Param:
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


def _values(param: Param) -> list[Any]:
    if isinstance(param, Categorical):
        return list(param.choices)
    if isinstance(param, Conditional):
        return [value for choices in param.cases.values() for value in choices]
    return []


def _check_choices(pass_cls: type[Pass], fixed: dict[str, Any], name: str, param: Param, where: str) -> None:
    """Each searched value must be valid for its field on its own (combinations may still be pruned)."""
    for value in _values(param):
        try:
            pass_cls.Config.model_validate({**fixed, name: value})
        except ValidationError as exc:
            own = [error for error in exc.errors() if error["loc"][:1] == (name,)]
            if own:
                raise ConfigError(f"{where}: value {value!r} is not allowed: {own[0]['msg']}") from None


def _restrict(param: Param, allowed: tuple[Any, ...] | None) -> Param:
    """Keeps only the values the target provider supports."""
    if allowed is None:
        return param
    if isinstance(param, Categorical):
        kept = tuple(value for value in param.choices if value in allowed)
        return Categorical(kept) if kept else Categorical((allowed[0],))
    if isinstance(param, Conditional):
        cases = {combo: tuple(v for v in choices if v in allowed) for combo, choices in param.cases.items()}
        return Conditional(param.parents, {combo: choices for combo, choices in cases.items() if choices})
    return param


def _resolve(param: Param, step_id: str, context: Mapping[str, Any], searched: Mapping[str, Param]) -> Param | None:
    """Prefixes a conditional's parents with the step id, or settles it when its parent is fixed."""
    if not isinstance(param, Conditional):
        return param
    parent = param.parents[0]
    if parent not in context:
        raise ConfigError(
            f"passes.{step_id}: 'when: {parent}' names no parameter of this pass; its parameters: {list(context)}"
        )
    if parent not in searched:
        choices = param.choices_given({parent: context.get(parent)})
        return Categorical(choices) if choices else None
    parent_values = _values(searched[parent])
    cases = {}
    for (key,), choices in param.cases.items():
        matches = [value for value in parent_values if value == key or str(value) == str(key)]
        if not matches:
            raise ConfigError(
                f"passes.{step_id}: case '{key}' is not a value of '{parent}' (its values: {parent_values})"
            )
        for match in matches:
            cases[(match,)] = choices
    return Conditional((f"{step_id}.{parent}",), cases)


def _gate(param: Param, flows: tuple[str, ...]) -> Param:
    """Makes a step's parameter active only in the flows that contain the step."""
    if isinstance(param, Categorical):
        return Conditional((FLOW,), {(flow,): param.choices for flow in flows})
    if isinstance(param, Conditional):
        cases = {(flow, *combo): choices for flow in flows for combo, choices in param.cases.items()}
        return Conditional((FLOW, *param.parents), cases)
    raise ConfigError(f"parameters of type {type(param).__name__} cannot yet be used in configs with several flows")


def _rule(index: int, rule: Any, params: Mapping[str, Param]):
    for name in [*rule.when, *rule.forbid]:
        if name not in params:
            raise ConfigError(f"rules[{index}]: '{name}' is not a searched parameter; searched: {list(params)}")
    when = dict(rule.when)
    forbid = {name: list(values) for name, values in rule.forbid.items()}

    def allowed(point: Mapping[str, Any]) -> bool:
        if any(point.get(name) != value for name, value in when.items()):
            return True
        return not any(point.get(name) in values for name, values in forbid.items() if name in point)

    return allowed


def describe_point(point: Point) -> str:
    return ", ".join(f"{name}={value}" for name, value in point.items()) or "(defaults)"
