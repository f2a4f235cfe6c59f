"""The accuracy strategies' own measurements (speed ceilings, the node profile), each call run as a stage in a worker
under the trial workers' limits. A failed stage is recorded (``stage_errors``) and answers as a failed measurement does.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from quantune.engine.executors.stage import Isolation, count_stage_seconds, run_stage


def _context(spec: Any) -> Any:
    from quantune.engine.executors.worker import runner_for

    return runner_for(spec).context


def ceiling_ratio(spec: Any, point: dict[str, Any], flow: tuple[str, ...]) -> float | None:
    """In the stage worker: the point's model latency over the original's (see ``probes.variant_ratio``)."""
    from quantune.engine.measure.probes import variant_ratio

    context = _context(spec)
    return variant_ratio(context, context.plan, point, flow)


def ceiling_ratios(
    spec: Any,
    items: list[tuple[dict[str, Any], tuple[str, ...]]],
    threshold: float,
    budget_s: float | None,
    pairs: list[tuple[int, int]] | None = None,
    anchor: int | None = None,
) -> list[float | None]:
    """In the stage worker: every point's model timed against the original in one session."""
    from quantune.engine.measure.probes import time_ceilings

    context = _context(spec)
    return time_ceilings(context, context.plan, items, threshold, budget_s, pairs=pairs or (), anchor=anchor)


def node_profile(spec: Any) -> dict[str, float]:
    """In the stage worker: each node's share of the original's kernel time."""
    from quantune.engine.measure.probes import measure_profile

    return measure_profile(_context(spec))


def isolated(
    fields: Mapping[str, Any], isolation: Isolation | None, spec: Any, local: tuple[Any, Any] | None = None
) -> dict[str, Any]:
    """``fields`` with their model-running functions run as stages; ceilings all cached are timed here (``local``)."""
    fields = dict(fields)
    if isolation is None or isolation.inline or spec is None or "latency_ratio" not in fields:
        return fields

    def latency_ratio(point: Mapping[str, Any], flow: tuple[str, ...]) -> float | None:
        outcome = run_stage("speed_ceiling", ceiling_ratio, spec, dict(point), tuple(flow), isolation=isolation)
        return outcome.value if outcome.ok else None

    def many_ratios(
        items: Sequence[tuple[Mapping[str, Any], tuple[str, ...]]],
        threshold: float,
        budget_s: float | None,
        pairs: Sequence[tuple[int, int]] = (),
        anchor: int | None = None,
    ) -> list[float | None]:
        plain = [(dict(point), tuple(flow)) for point, flow in items]
        pairs = [(int(item), int(ref)) for item, ref in pairs]
        if local is not None and local[0].before_ceilings is not None:
            waited = time.perf_counter()
            try:
                local[0].before_ceilings()  # the models built ahead (prebuild.py)
            finally:  # the ceilings' one-off wait: neither a trial's work nor the next trial's estimate
                count_stage_seconds(time.perf_counter() - waited)
        left = isolation.deadline.left_s()  # the run's limit bounds the timing here as a stage's
        if left == 0.0:
            return [None] * len(plain)
        if left is not None:
            budget_s = left if budget_s is None else min(budget_s, left)
        try:
            if local is not None:
                from quantune.engine.measure.probes import cached_ceilings

                started = time.perf_counter()
                try:
                    here = cached_ceilings(
                        local[0], local[1], plain, threshold, budget_s, isolation.deadline.at, pairs, anchor
                    )
                finally:  # a one-off stage run here: the loop must not count it as every trial's work
                    count_stage_seconds(time.perf_counter() - started)
                if here is not None:
                    return here
            outcome = run_stage(
                "speed_ceiling", ceiling_ratios, spec, plain, threshold, budget_s, pairs, anchor, isolation=isolation
            )
            return outcome.value if outcome.ok else [None] * len(plain)
        finally:
            if local is not None and (pending := local[0].original_timed) is not None:
                local[0].original_timed = None
                pending(None)  # the ceilings did not time the original here: timed alone
            if local is not None and (after := local[0].after_ceilings) is not None:
                local[0].after_ceilings = None
                after()

    costs: dict[str, float] | None = None

    def node_costs() -> Mapping[str, float]:
        nonlocal costs
        if costs is None and local is not None:  # profiled ahead (prebuild.py): read here
            from quantune.engine.measure.probes import cached_profile

            costs = cached_profile(local[0])
        if costs is None:
            outcome = run_stage("node_profile", node_profile, spec, isolation=isolation)
            costs = outcome.value if outcome.ok else {}
        return costs

    fields["latency_ratio"] = latency_ratio
    if "paired_latency" in fields:
        fields["paired_latency"] = _paired(fields["paired_latency"], spec, isolation, local)
    if "ceiling_ratios" in fields:
        fields["ceiling_ratios"] = many_ratios
    fields["node_costs"] = node_costs
    return fields


def paired_latency(spec: Any, candidate: Any, reference: Any) -> dict[str, Any] | None:
    """In the stage worker: one model timed against another (engine/measure/paired_timing.py)."""
    from quantune.engine.measure.paired_timing import paired_latency as timed
    from quantune.engine.measure.probes import variant_builder

    context = _context(spec)
    return timed(context, candidate, reference, variant_builder(context, context.plan))


def _paired(here: Any, spec: Any, isolation: Isolation, local: tuple[Any, Any] | None) -> Any:
    """The paired timing of two trials' models: in this process when both are cached, else as a stage."""

    def paired(candidate: Any, candidate_flow: Any, reference: Any, reference_flow: Any) -> Any:
        items = ((dict(candidate), tuple(candidate_flow)), (dict(reference), tuple(reference_flow)))
        if local is not None:
            from quantune.engine.measure.probes import variant_model
            from quantune.passes.cached import NotCached, only_cached

            started = time.perf_counter()
            try:
                with only_cached():
                    for point, flow in items:
                        variant_model(local[0], local[1], point, flow)
                    # in this process, so the stages' deadline does not stop it: the timing keeps it
                    return here(*items[0], *items[1], limit=isolation.deadline.at)
            except NotCached:
                pass
            finally:
                count_stage_seconds(time.perf_counter() - started)
        outcome = run_stage("paired_latency", paired_latency, spec, *items, isolation=isolation)
        return outcome.value if outcome.ok else None

    return paired
