"""Speed facts for the ``quantune`` strategy: speed ceilings, op-type classes, fallback prices. No fallback is faster
than quantizing everything, so a flow wins only if its ceiling beats the original."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quantune.graph.capability import Group
from quantune.passes.registry import find_pass
from quantune.space import Conditional, Point
from quantune.strategy.accuracy.context import AccuracyContext
from quantune.strategy.base import SearchProblem

# Op types whose quantized kernels carry the speed: a candidate keeps at least one of them int8.
COMPUTE_TYPES = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Attention", "LSTM", "GRU"})
# Besides compute, what Neural Compressor quantizes by default: a residual add or a scale stays int8 and saves a Q/DQ
# pair.
SAFE_TYPES = frozenset({"Add", "Mul"})


@dataclass
class Variant:
    """One fully-quantized variant of a flow (its ceiling trial) and what it measured."""

    ctx: AccuracyContext
    point: Point
    label: str
    latency_ms: float | None = None
    side_by_side: float | None = None  # latency over the original's, timed interleaved with it
    meets: bool = False
    violation: float = float("inf")
    failed: bool = False
    timed: Point | None = None  # the point whose model times the ceiling, when not ``point`` (stand_in)

    @property
    def timing_point(self) -> Point:
        """The point whose model times this ceiling: its stand-in (:func:`stand_in`) when it has one."""
        return self.timed if self.timed is not None else self.point

    def ratio(self, baseline_ms: float | None) -> float | None:
        """Latency over the original's: side by side when timed so, else against the baseline figure."""
        if self.side_by_side is not None:
            return self.side_by_side
        if self.latency_ms is None or not baseline_ms:
            return None
        return self.latency_ms / baseline_ms


STAND_IN_ROWS = 2  # calibration rows of a static ceiling built only to be timed (stand_in)


def stand_in(ctx: AccuracyContext, point: Point) -> Point | None:
    """``point`` calibrated on ``STAND_IN_ROWS`` rows, the same graph and speed, or None where nothing is saved."""
    from quantune.passes.registry import find_pass

    calibrating = []
    for step in ctx.flow:
        cls = find_pass(str(ctx.problem.step_passes.get(step)))
        if cls is None:
            return None
        if cls.needs_calibration:
            calibrating.append((step, cls))
    if [step for step, _ in calibrating] != [ctx.quant_step] or ctx.knobs.samples is None:
        return None
    rows = point.get(ctx.key(ctx.knobs.samples))
    if isinstance(rows, int) and rows <= STAND_IN_ROWS:
        return None
    return {**point, ctx.key(ctx.knobs.samples): STAND_IN_ROWS}


def speed_variants(ctx: AccuracyContext) -> list[tuple[Point, str]]:
    """The flow's fastest-candidate points: each value of ``knobs.ceilings``, from :func:`nc_defaults`."""
    base = ctx.base_point()
    if ctx.dynamic and not ctx.knobs.ceilings:
        return [(base, f"{ctx.flow_name}: {ctx.quant_pass}")]
    params = ctx.quant_params()
    start = nc_defaults(ctx, base)
    op_types = frozenset(ctx.capability.op_types())
    axes = [
        (name, ctx.pass_cls.ceiling_values(name, preferred_values(params.get(ctx.key(name)), start), op_types))
        for name in ctx.knobs.ceilings
    ]
    out: list[tuple[Point, str]] = []
    for values in itertools.product(*(choices for _, choices in axes)):
        point = dict(start)
        point.update({ctx.key(name): value for (name, _), value in zip(axes, values, strict=True) if value is not None})
        if not ctx.dynamic:
            point = fill_conditionals(ctx, point)
        if ctx.valid(point):
            # the inner axis first: "QDQ/uint8", "mixed/extended"
            out.append((point, _label(ctx, [v for v in reversed(values) if v is not None and v != "none"])))
    return out or [(start, _label(ctx, []))]


def _label(ctx: AccuracyContext, values: Sequence[Any]) -> str:
    name = "/".join(str(v) for v in values)
    if ctx.dynamic:
        return f"{ctx.flow_name}: dynamic{' ' + name if name else ''}"
    return f"{ctx.flow_name}: {name or 'defaults'}"


def build_order(ctx: AccuracyContext, point: Mapping[str, Any]) -> int:
    """A variant's place in the build order: static, dynamic, then ``knobs.built_last`` (left out first)."""
    if ctx.dynamic:
        return 1
    slow = ctx.knobs.built_last.items()
    return 2 if any(point.get(ctx.key(name)) == value for name, value in slow) else 0


# Op types that mark a sequence model, which Neural Compressor and onnxruntime quantize dynamically.
SEQUENCE_TYPES = frozenset({"LSTM", "GRU", "RNN", "Attention"})


def likeliest(variants: Sequence[Variant]) -> Variant | None:
    """The ceiling likeliest fast and in budget: dynamic for a sequence model, else the first static one; or None."""
    if not variants:
        return None
    dynamic = [v for v in variants if v.ctx.dynamic]
    static = [v for v in variants if v not in dynamic]
    # the dynamic step's groups hold the RNNs a static step cannot quantize
    types = [g.op_type for g in (dynamic or variants)[0].ctx.capability.groups]
    sequence = bool(SEQUENCE_TYPES & set(types)) or types.count("MatMul") + types.count("Gemm") > types.count("Conv")
    if dynamic and (sequence or not static):

        def rank(variant: Variant) -> tuple[int, ...]:
            """A pass that knows its fastest values first, then the fewest values off them."""
            fastest = variant.ctx.pass_cls.fastest(frozenset(types))
            point, key = variant.point, variant.ctx.key
            return (int(not fastest), *(int(point.get(key(name)) != value) for name, value in fastest.items()))

        return min(dynamic, key=rank)
    return static[0]


def nc_defaults(ctx: AccuracyContext, base: Point) -> Point:
    """``base`` with Neural Compressor's accuracy defaults where searched: per-channel (7-bit where dot products
    saturate)."""
    params, knobs = ctx.quant_params(), ctx.knobs
    start = dict(base)
    channel = ctx.key(knobs.per_channel) if knobs.per_channel else None
    if channel in params:
        start[channel] = True
    if knobs.narrow and ctx.key(knobs.narrow) in params and channel and start.get(channel) is True:
        start[ctx.key(knobs.narrow)] = bool(ctx.problem.int8_saturates)
    return start


def fill_conditionals(ctx: AccuracyContext, point: Point) -> Point:
    """Active conditional parameters of the quant step at their first value."""
    filled = dict(point)
    for name, param in ctx.quant_params().items():
        if name in filled or not isinstance(param, Conditional):
            continue
        choices = _choices(param, filled)
        if choices:
            filled[name] = False if False in choices else choices[0]
    return filled


def slower_twins(variants: Sequence[Variant], provider: str) -> list[tuple[Variant, Variant, str]]:
    """(variant, faster twin, why) for each variant whose pass knows its kernels slow there (``Pass.faster_twin``)."""
    from quantune.passes.registry import find_pass

    out = []
    for variant in variants:
        ctx = variant.ctx
        pass_cls = find_pass(ctx.quant_pass)
        if pass_cls is None:  # a plugin pass not registered here: nothing known of it
            continue
        config = _step_config(ctx, pass_cls, variant.point)
        where = next((str(v) for k, v in variant.point.items() if k.endswith(".provider")), provider)
        found = pass_cls.faster_twin(config, where, frozenset(ctx.capability.op_types()))
        if found is None:
            continue
        overrides, why = found
        twin_point = {**variant.point, **{ctx.key(name): value for name, value in overrides.items()}}
        twin = next((v for v in variants if v is not variant and v.ctx is ctx and v.point == twin_point), None)
        if twin is not None:
            out.append((variant, twin, why))
    return out


def _step_config(ctx: AccuracyContext, pass_cls: Any, point: Mapping[str, Any]) -> dict[str, Any]:
    """The quant step's parameter values at ``point``: the pass defaults, the user's fixed ones, the point's."""
    values: dict[str, Any] = {}
    for name, field in pass_cls.Config.model_fields.items():
        if not field.is_required():
            values[name] = field.get_default(call_default_factory=True)
    values.update(ctx.problem.step_fixed.get(ctx.quant_step, {}))
    prefix = f"{ctx.quant_step}."
    values.update({key[len(prefix) :]: value for key, value in point.items() if key.startswith(prefix)})
    return values


def speed_params(ctx: AccuracyContext, point: Mapping[str, Any]) -> Point:
    """The values of a point that decide its speed class (held fixed while accuracy is recovered)."""
    keys = [ctx.key(name) for name in ctx.knobs.speed_class]
    return {key: point[key] for key in keys if key in point}


def group_cost(group: Group, costs: Mapping[str, float]) -> float:
    """The group's share of the original's kernel time (0 when unknown)."""
    return sum(costs.get(node, 0.0) for node in group.nodes)


def priced(scored: Sequence[tuple[Group, float]], costs: Mapping[str, float]) -> list[tuple[Group, float]]:
    """Groups by sensitivity / (1 + time share), highest first; without a profile, sensitivity alone."""
    if not costs:
        return list(scored)
    order = {group.name: index for index, (group, _) in enumerate(scored)}
    value = [(group, score / (1.0 + group_cost(group, costs))) for group, score in scored]
    return sorted(value, key=lambda gs: (-gs[1], order[gs[0].name]))


def preferred_values(param: Any, point: Mapping[str, Any]) -> list[Any]:
    """A searched parameter's values in the order the space prefers (heaviest weight first)."""
    if param is None:
        return [None]
    choices = list(_choices(param, point))
    weights = getattr(param, "weights", None)
    if weights and len(weights) == len(choices):
        choices = [c for _, c in sorted(zip(weights, choices, strict=True), key=lambda wc: -wc[0])]
    return choices or [None]


def _choices(param: Any, point: Mapping[str, Any]) -> tuple[Any, ...]:
    try:
        return tuple(param.choices_given(point))
    except (KeyError, AttributeError, TypeError):
        return ()


def coarse_costs(problem: SearchProblem) -> dict[str, float]:
    """Each node's share of the original's time on a coarse grid, so orders taken from it hold between runs."""
    costs = problem.node_costs if problem.objective == "latency" else None
    return {node: _coarse(share) for node, share in costs().items()} if costs is not None else {}


def _coarse(share: float) -> float:
    """``share`` on a grid of powers of 1.25 (0 stays 0): near-equal shares tie and keep their fixed order."""
    if share <= 0.0 or not math.isfinite(share):
        return 0.0
    return 1.25 ** round(math.log(share, 1.25))


def unrefined_flow(step_passes: Mapping[str, str], flow: tuple[str, ...], quant_step: str) -> tuple[str, ...] | None:
    """``flow`` without its refining steps after the quant step, or None when it has none."""
    after = flow[flow.index(quant_step) + 1 :]
    refining = {step for step in after if (cls := find_pass(str(step_passes.get(step)))) and cls.role == "recover"}
    return tuple(step for step in flow if step not in refining) if refining else None
