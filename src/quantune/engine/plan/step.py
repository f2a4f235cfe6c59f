"""A step: one pass instance in the plan, with the values the user fixed (apart from the plan, so the
modules that build steps and flows need not import it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from quantune.passes import Pass, PassConfig

FLOW = "flow"  # the space's parameter that picks a flow, when there are several
NodeLister = Callable[[], list[tuple[str, str]]]


@dataclass(frozen=True)
class Step:
    """One pass instance with the parameter values the user fixed; ``subsets`` maps a list-valued
    parameter to the elements searched one boolean flag each."""

    id: str
    pass_cls: type[Pass]
    fixed: Mapping[str, Any]
    subsets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    joints: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # joint param name -> pass params

    def config_for(self, point: Mapping[str, Any]) -> PassConfig:
        """The pass config for ``point``: fixed values, overridden by any ``<step>.<param>`` the
        point holds (searched by a sampler, or set by a strategy such as an op fallback)."""
        values = dict(self.fixed)
        prefix = f"{self.id}."
        fields = self.pass_cls.Config.model_fields
        for key, value in point.items():
            if key.startswith(prefix) and key[len(prefix) :] in fields:
                values[key[len(prefix) :]] = value
        for name, members in self.joints.items():
            if f"{prefix}{name}" in point:
                values.update(zip(members, point[f"{prefix}{name}"], strict=True))
        for name, elements in self.subsets.items():
            chosen = [element for element in elements if point.get(subset_key(self.id, name, element))]
            values[name] = [*values.get(name, []), *chosen]
        return self.pass_cls.Config.model_validate(values)


def subset_key(step_id: str, param: str, element: str) -> str:
    return f"{step_id}.{param}[{element}]"
