"""From config to plan: the steps, the flows through them, and one search space over all.

Parameters are ``<step id>.<parameter>``, active only in the flows holding the step; flows
sharing a prefix share work through the content-addressed cache. Invalid points are pruned as
space constraints (pass validators, provider rules, model facts, the user's ``rules``) so none runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from quantune.config import Config
from quantune.engine.plan.flows import build_flows, check_last_steps, gate
from quantune.engine.plan.providers import PASS_NAME, provider_rule
from quantune.engine.plan.rules import build_rule
from quantune.engine.plan.search_syntax import build_step
from quantune.engine.plan.step import FLOW, NodeLister, Step, subset_key
from quantune.errors import ConfigError
from quantune.passes import PassConfig
from quantune.space import Categorical, Param, SearchSpace

__all__ = ["FLOW", "NodeLister", "Plan", "Step", "build_plan", "subset_key"]


@dataclass(frozen=True)
class Plan:
    steps: Mapping[str, Step]
    flows: Mapping[str, tuple[str, ...]]
    step_params: Mapping[str, Mapping[str, Param]]
    space: SearchSpace
    rules: tuple[Any, ...] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)  # of the model flows start from

    def flow_of(self, point: Mapping[str, Any]) -> tuple[str, ...]:
        if len(self.flows) == 1:
            return next(iter(self.flows.values()))
        return self.flows[point[FLOW]]

    def configs_for(
        self, point: Mapping[str, Any], flow: tuple[str, ...] | None = None
    ) -> list[tuple[Step, PassConfig]]:
        steps = flow if flow is not None else self.flow_of(point)
        return [(self.steps[step_id], self.steps[step_id].config_for(point)) for step_id in steps]

    def is_runnable(self, point: Mapping[str, Any], flow: tuple[str, ...] | None = None) -> bool:
        """Whether ``point`` (run through ``flow``, by default the point's own) passes every check."""
        try:
            configs = self.configs_for(point, flow)
        except (ValidationError, KeyError):
            return False
        return self._rules_allow(point, configs)

    def _rules_allow(self, point: Mapping[str, Any], configs: list[tuple[Step, PassConfig]]) -> bool:
        """Each pass must accept what the steps before it made and support the model the flow starts from;
        then the user's rules, which read the resolved pass configs."""
        for index, (step, config) in enumerate(configs):
            upstream = [(earlier.pass_cls.name, earlier_config) for earlier, earlier_config in configs[:index]]
            if upstream and not step.pass_cls.accepts(config, upstream):
                return False
            if self.facts and not step.pass_cls.supports(config, self.facts, upstream):
                return False
        if not self.rules:
            return True
        values = {f"{step.id}.{name}": value for step, config in configs for name, value in config}
        if FLOW in point:
            values[FLOW] = point[FLOW]
        return all(rule(values) for rule in self.rules)

    def subspace(self, step_ids: list[str], fixed: Mapping[str, Any] | None = None) -> SearchSpace:
        """The space of ``step_ids``' own parameters; ``fixed`` holds earlier steps' chosen values."""
        fixed = dict(fixed or {})
        params: dict[str, Param] = {}
        for step_id in step_ids:
            params.update(self.step_params[step_id])
        steps = tuple(step_ids)

        return SearchSpace(params, [lambda point: self.is_runnable({**fixed, **point}, steps)])

    def flow_space(self, name: str) -> SearchSpace:
        return self.subspace(list(self.flows[name]), {FLOW: name} if len(self.flows) > 1 else {})


def build_plan(config: Config, nodes: NodeLister | None = None, facts: Mapping[str, Any] | None = None) -> Plan:
    """``nodes`` lists the input model's (name, op type) pairs, for ``subset_of`` searches;
    ``facts`` describe the model flows start from (see :mod:`quantune.prepare.facts`)."""
    steps: dict[str, Step] = {}
    step_params: dict[str, dict[str, Param]] = {}
    # with target.providers the provider is a parameter: its pruning is per point (provider_rule)
    searched = any(entry.name == PASS_NAME for entry in config.passes)
    provider = "" if searched else config.target.provider
    for index, entry in enumerate(config.passes):
        step, params = build_step(index, entry, provider, nodes)
        steps[step.id] = step
        step_params[step.id] = params
    flows = build_flows(config, steps, provider, facts or {})
    check_last_steps(flows, steps)
    space_params: dict[str, Param] = {}
    if len(flows) > 1:
        space_params[FLOW] = Categorical(tuple(flows))
    for step_id, params in step_params.items():
        using = tuple(name for name, flow in flows.items() if step_id in flow)
        if not using:
            continue
        for name, param in params.items():
            space_params[name] = gate(param, using) if len(flows) > 1 else param
    rules = tuple(build_rule(index, rule, steps) for index, rule in enumerate(config.rules))
    if searched:
        rules = (*rules, provider_rule(steps, flows, config.target.provider))
    try:
        space = SearchSpace(space_params)
    except ValueError as exc:
        raise ConfigError(f"passes: {exc}") from None
    plan = Plan(steps, flows, step_params, space, rules, dict(facts or {}))
    space.constraints.append(plan.is_runnable)
    return plan
