"""Flows: the paths through the steps (a list, a tree, or ``auto``), and what gates a step to its flows.

A step's parameters are active only in the flows that contain the step (``gate``); flows a
target provider cannot run are pruned here, before the space is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantune.config import Config
from quantune.engine.plan.auto_flows import auto_flows
from quantune.engine.plan.step import FLOW, Step
from quantune.errors import ConfigError
from quantune.space import Conditional, Param


def build_flows(
    config: Config, steps: Mapping[str, Step], provider: str, facts: Mapping[str, Any]
) -> dict[str, tuple[str, ...]]:
    raw = config.flows
    where = next((sid for sid, step in steps.items() if step.pass_cls.role == "provider"), None)
    placed = {sid: step for sid, step in steps.items() if sid != where}
    if raw is None:
        paths = [tuple(placed)]
    elif raw == "auto":  # placed by quantune from the passes listed and the model's facts
        paths = auto_flows(placed, facts, config.objective == "size" or "size" in (config.objectives or []))
    elif isinstance(raw, dict):
        paths = list(_tree_paths(raw, ()))
    else:
        paths = [tuple(flow) for flow in raw]
    if where is not None:  # target.providers: every flow ends where it runs; the original on each provider too
        paths = [(*[s for s in path if s != where], where) for path in paths]
        paths.append((where,))
        provider = ""  # pruned per point instead (engine/plan/providers.py)
    flows: dict[str, tuple[str, ...]] = {}
    for index, path in enumerate(paths):
        if not path:
            raise ConfigError(f"flows[{index}]: a flow needs at least one pass")
        for step_id in path:
            if step_id not in steps:
                raise ConfigError(f"flows[{index}]: no pass with id '{step_id}'; pass ids are {list(steps)}")
        unsupported = [
            s for s in path if provider and steps[s].pass_cls.providers and provider not in steps[s].pass_cls.providers
        ]
        if unsupported:
            continue  # pruned: the target cannot run this flow's output
        if ">".join(path) not in flows:
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


def gate(param: Param, flows: tuple[str, ...]) -> Param:
    """Makes a step's parameter active only in the flows that contain the step."""
    if isinstance(param, Conditional):
        cases = {(flow, *combo): case for flow in flows for combo, case in param.cases.items()}
        return Conditional((FLOW, *param.parents), cases)
    return Conditional((FLOW,), {(flow,): param for flow in flows})


def check_last_steps(flows: Mapping[str, tuple[str, ...]], steps: Mapping[str, Step]) -> None:
    """A pass whose output lives partly beside the model (session_tuning's settings) ends its flows:
    the next pass would read the model without it."""
    for flow in flows.values():
        if steps[flow[-1]].pass_cls.role == "provider":  # it reads and keeps its input's settings
            flow = flow[:-1]
        for step_id in flow[:-1]:
            if steps[step_id].pass_cls.last_in_flow:
                raise ConfigError(
                    f"flows: '{step_id}' ({steps[step_id].pass_cls.name}) must be the last step of a flow, "
                    f"but {' > '.join(flow)} goes on after it; put it last in passes (or in flows)"
                )
