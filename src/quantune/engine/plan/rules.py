"""User rules: points whose resolved pass values match ``when`` and any ``forbid`` never run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantune.engine.plan.step import FLOW, Step
from quantune.errors import ConfigError


def build_rule(index: int, rule: Any, steps: Mapping[str, Step]):
    """A rule names pass parameters as ``<step id>.<parameter>`` (or ``flow``)."""
    for name in [*rule.when, *rule.forbid]:
        step_id, _, param = name.partition(".")
        if name == FLOW:
            continue
        if step_id not in steps or param not in steps[step_id].pass_cls.Config.model_fields:
            known = {sid: list(step.pass_cls.Config.model_fields) for sid, step in steps.items()}
            raise ConfigError(
                f"rules[{index}]: '{name}' names no pass parameter; use '<step id>.<parameter>' from {known}"
            )
    when = dict(rule.when)
    forbid = {name: list(values) for name, values in rule.forbid.items()}

    def allowed(values: Mapping[str, Any]) -> bool:
        if any(name not in values or values[name] != value for name, value in when.items()):
            return True
        return not any(values.get(name) in forbidden for name, forbidden in forbid.items() if name in values)

    return allowed
