"""What accuracy-driven strategies know about the flow and the model, and how they write points: fallback only through
the quant step's own parameters (its pass's ``knobs``), user constraints (``fp32_*``, ``int8_*``, ``precisions``) kept.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from quantune.errors import QuantuneError
from quantune.graph.capability import Group, ModelCapability, Precision
from quantune.graph.head import head_nodes, lead_in_nodes
from quantune.passes.base import RECIPE_ROLES, Knobs, Pass
from quantune.passes.registry import PASSES, find_pass
from quantune.space import Categorical, Point, SearchSpace
from quantune.strategy.base import SearchProblem
from quantune.strategy.options import AccuracyOptions, options_as


def quantizes(pass_name: str | None) -> str | None:
    """The pass's ``quantizes`` trait: "static", "dynamic" (groups are single weights) or None."""
    found = find_pass(pass_name)
    return found.quantizes if found is not None else None


def is_recipe(pass_name: str | None) -> bool:
    """Whether the pass is a range-fixing recipe around the quantizer (cle, smooth_quant, ...)."""
    found = find_pass(pass_name)
    return found is not None and found.role in RECIPE_ROLES


def _quantizing_passes() -> str:
    return ", ".join(repr(name) for name, cls in sorted(PASSES.registered().items()) if cls.quantizes)


FLOW_KEY = "flow"


@dataclass
class AccuracyContext:
    problem: SearchProblem
    flow_name: str
    flow: tuple[str, ...]
    quant_step: str
    capability: ModelCapability
    always_fp32: list[str]  # node names
    candidates: list[Group]  # groups a strategy may fall back
    precisions: list[Precision]
    options: AccuracyOptions = field(default_factory=AccuracyOptions)
    # every group's sensitivity score as ranked (for the report: why a group stayed in fp32)
    scores: dict[str, dict[str, Any]] = field(default_factory=dict)
    head: set[str] = field(default_factory=set)  # node names between the last compute op and the outputs
    lead_in: set[str] = field(default_factory=set)  # node names between the inputs and the first compute ops

    @classmethod
    def from_problem(cls, problem: SearchProblem, strategy: str) -> AccuracyContext:
        """The context of the flow the strategies tune: the ``flow`` option's, else the first with a quant step."""
        name, steps = cls._flows(problem, strategy)[0]
        return cls._for_flow(problem, name, steps, options_as(problem.options, AccuracyOptions))

    @classmethod
    def all_from_problem(
        cls, problem: SearchProblem, strategy: str, known: AccuracyContext | None = None
    ) -> list[AccuracyContext]:
        """One context per flow with a quant step (or the ``flow`` option's), ``known`` reused."""
        options = options_as(problem.options, AccuracyOptions)
        return [
            known if known is not None and known.flow_name == name else cls._for_flow(problem, name, steps, options)
            for name, steps in cls._flows(problem, strategy)
        ]

    @staticmethod
    def _flows(problem: SearchProblem, strategy: str) -> list[tuple[str, tuple[str, ...]]]:
        if problem.capability is None:
            raise QuantuneError(f"search.strategy: '{strategy}' needs the model's graph (run it through the engine)")
        chosen = options_as(problem.options, AccuracyOptions).flow
        flows = [
            (name, tuple(steps))
            for name, steps in problem.flows.items()
            if any(quantizes(problem.step_passes.get(step)) for step in steps)
        ]
        if chosen is not None:
            flows = [(name, steps) for name, steps in flows if name == chosen]
        if not flows:
            raise QuantuneError(
                f"search.strategy: '{strategy}' tunes per-operator precision of a quantizing pass "
                f"({_quantizing_passes()}); "
                f"no flow {'named ' + repr(chosen) + ' ' if chosen else ''}has one (flows: {list(problem.flows)})"
            )
        return flows

    @classmethod
    def _for_flow(
        cls, problem: SearchProblem, flow_name: str, flow: tuple[str, ...], options: AccuracyOptions
    ) -> AccuracyContext:
        assert problem.capability is not None
        quant_step = next(step for step in flow if quantizes(problem.step_passes.get(step)))
        fixed = problem.step_fixed.get(quant_step, {})
        mode = "dynamic" if quantizes(problem.step_passes.get(quant_step)) == "dynamic" else "static"
        knobs = PASSES.get(quant_pass := str(problem.step_passes[quant_step])).knobs
        if knobs.exclude is None:  # a plugin quantizer that does not say how a node stays float
            raise QuantuneError(
                f"passes: '{quant_pass}' names no parameter that keeps nodes in float (Pass.knobs.exclude)"
            )
        op_types = fixed.get(knobs.op_types) if knobs.op_types else None
        capability = problem.capability(op_types, mode, flow[: flow.index(quant_step)])
        fp32_types = set(options.fp32_op_types)
        fp32_nodes = set(options.fp32_nodes) | set(fixed.get(knobs.exclude, []) if knobs.exclude else [])
        int8_types = set(options.int8_op_types)
        int8_nodes = set(options.int8_nodes)
        unknown = (fp32_nodes | int8_nodes) - set(capability.by_name)
        if unknown:
            raise QuantuneError(f"search.strategy_options: no nodes named {sorted(unknown)} in the model")
        always = sorted(
            name
            for name in capability.quantizable
            if name in fp32_nodes or capability.by_name[name].op_type in fp32_types
        )
        head = set(head_nodes(capability.nodes))
        lead_in = set(lead_in_nodes(capability.nodes, capability.float_inputs))
        candidates = [
            group
            for group in capability.groups
            # a head's Concat, a lead-in's framing of the raw input, is a unit (graph/head.py)
            if (not group.shape_only or (head | lead_in) & set(group.nodes))
            and not set(group.nodes) <= set(always)
            and not (set(group.nodes) & int8_nodes)
            and group.op_type not in int8_types
        ]
        precisions: list[Precision] = list(options.precisions)  # int16 or fp32: the options model checked them
        if mode == "dynamic":
            precisions = [p for p in precisions if p == "fp32"] or ["fp32"]  # no tensor overrides in dynamic
        context = cls(problem, flow_name, flow, quant_step, capability, always, candidates, precisions, options)
        context.head = head
        context.lead_in = lead_in
        return context

    # -- points -------------------------------------------------------------------------------
    @property
    def flow_fixed(self) -> Point:
        return {FLOW_KEY: self.flow_name} if len(self.problem.flows) > 1 else {}

    def base_point(self) -> Point:
        """The pass defaults (and the user's fixed values) for this flow, with user constraints."""
        return self.with_fallback(dict(self.flow_fixed), {})

    def with_fallback(self, point: Mapping[str, Any], precisions: Mapping[str, Precision]) -> Point:
        """``point`` with these groups in these precisions (and the always-fp32 nodes excluded)."""
        excluded, overrides = self.capability.assignment(precisions, base_excluded=self.always_fp32)
        exclude, override = self.fallback_keys
        out = {k: v for k, v in point.items() if k not in (exclude, override)}
        if excluded and exclude:
            out[exclude] = excluded
        if overrides and override:
            out[override] = overrides
        return out

    @property
    def fallback_keys(self) -> tuple[str | None, str | None]:
        """The quant step's keys that write a fallback: (nodes kept in float, tensor types overridden)."""
        knobs = self.knobs
        return self.key(knobs.exclude) if knobs.exclude else None, self.key(
            knobs.overrides
        ) if knobs.overrides else None

    def fallback_of(self, names: Iterable[str], precision: Precision = "fp32") -> dict[str, Precision]:
        return dict.fromkeys(names, precision)

    @property
    def quant_pass(self) -> str:
        """The quant step's pass (one whose ``quantizes`` trait is set)."""
        return str(self.problem.step_passes[self.quant_step])

    @property
    def pass_cls(self) -> type[Pass]:
        return PASSES.get(self.quant_pass)

    @property
    def knobs(self) -> Knobs:
        """The quant step's parameters by what they do (its pass's ``knobs`` trait)."""
        return self.pass_cls.knobs

    def value(self, point: Mapping[str, Any], param: str) -> Any:
        """The quant step's ``param`` at ``point``: the point's, else the user's fixed one, else the pass default."""
        fixed = self.problem.step_fixed.get(self.quant_step, {})
        field = self.pass_cls.Config.model_fields.get(param)
        return point.get(self.key(param), fixed.get(param, None if field is None else field.default))

    @property
    def dynamic(self) -> bool:
        return quantizes(self.quant_pass) == "dynamic"

    def key(self, param: str) -> str:
        return f"{self.quant_step}.{param}"

    def valid(self, point: Mapping[str, Any]) -> bool:
        return self.problem.space.is_valid(point)

    def flow_space(self, fixed: Mapping[str, Any], names: Sequence[str] | None = None) -> SearchSpace:
        """The flow's searched parameters (only ``names`` when given), with ``fixed`` set in every point."""
        full = self.problem.subspace(list(self.flow), {**self.flow_fixed, **fixed})
        params = {k: v for k, v in full.params.items() if (names is None or k in names) and k not in fixed}
        context = {**self.flow_fixed, **fixed}
        space = self.problem.space

        def runnable(point: Mapping[str, Any]) -> bool:
            return space.is_valid({**context, **point})

        return SearchSpace(params, [runnable], fixed={k: v for k, v in fixed.items() if k not in params})

    def quant_params(self) -> dict[str, Any]:
        """The quant step's searched parameters (name -> Param) in this flow."""
        full = self.problem.subspace(list(self.flow), dict(self.flow_fixed))
        prefix = f"{self.quant_step}."
        return {k: v for k, v in full.params.items() if k.startswith(prefix)}

    def recipe_params(self) -> dict[str, tuple[Any, ...]]:
        """Searched categorical parameters of recipe passes (cle, smooth_quant) in the flow."""
        full = self.problem.subspace(list(self.flow), dict(self.flow_fixed))
        steps = [s for s in self.flow if is_recipe(self.problem.step_passes.get(s))]
        return {
            name: param.choices
            for name, param in full.params.items()
            if isinstance(param, Categorical) and any(name.startswith(f"{s}.") for s in steps)
        }

    def has_recipes(self) -> bool:
        return any(is_recipe(self.problem.step_passes.get(s)) for s in self.flow)

    # -- sensitivity --------------------------------------------------------------------------
    def ranked(self, point: Mapping[str, Any], groups: Sequence[Group] | None = None) -> list[tuple[Group, float]]:
        """Candidate groups, most sensitive first (graph order when no sensitivity is available)."""
        pool = list(self.candidates if groups is None else groups)
        if self.problem.sensitivity is None:
            return [(group, 0.0) for group in pool]
        scores = self.problem.sensitivity(dict(point), self.flow)
        scored = [(group, _finite(sum(scores.get(node, 0.0) for node in group.nodes))) for group in pool]
        for group, score in scored:
            self.scores[group.name] = {"score": score, "op_type": group.op_type, "nodes": list(group.nodes)}
            if self.head & set(group.nodes):
                self.scores[group.name]["head"] = True
            if self.lead_in & set(group.nodes):
                self.scores[group.name]["lead_in"] = True
        order = {group.name: index for index, group in enumerate(pool)}
        return sorted(scored, key=lambda gs: (-gs[1], order[gs[0].name]))


def _finite(score: float) -> float:
    """A NaN score (a broken measurement) ranks first, never at an arbitrary place in the sort."""
    return float("inf") if math.isnan(score) else score


def describe(names: Sequence[str], limit: int = 4) -> str:
    """A short list of group names for stage texts, an exporter's path shortened to its last two module names."""
    short = [_short(name) for name in names]
    text = ", ".join(short[:limit])
    return f"[{text}{', ...' if len(short) > limit else ''}]"


def _short(name: str) -> str:
    parts = name.strip("/").split("/")
    return "/".join(parts[-3:-1]) if len(parts) >= 3 else name
