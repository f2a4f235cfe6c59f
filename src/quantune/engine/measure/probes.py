"""What the engine adds to a :class:`SearchProblem` for accuracy-driven strategies: the model's capability, each step's
pass and fixed parameters, and functions that measure (stages.py runs them in workers). Strategies never touch files."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from quantune import progress
from quantune.engine.measure.baseline import RETIME_ROUNDS
from quantune.engine.measure.paired_timing import MIN_ROUNDS as PAIRED_MIN_ROUNDS
from quantune.engine.measure.paired_timing import store_pairs
from quantune.engine.measure.sensitivity_probe import CPU, SensitivityProbe
from quantune.engine.plan.providers import provider_step
from quantune.evaluate.latency import TimingRequest
from quantune.evaluate.paired import paired_ratio
from quantune.evaluate.profile import node_time_shares
from quantune.evaluate.rounds import UnsureRatio, ceiling_medians
from quantune.graph.capability import ModelCapability
from quantune.passes.cached import run_flow_cached
from quantune.passes.timing import timing_for
from quantune.space import Point
from quantune.store import cache_key
from quantune.strategy.options import AccuracyOptions, StrategyOptions, options_as

log = logging.getLogger("quantune.strategy")  # the strategies' log: these probes serve them


def accuracy_fields(
    context: Any, plan: Any, options: StrategyOptions | Mapping[str, Any] | None = None, isolation: Any = None
) -> dict[str, Any]:
    """SearchProblem fields from the engine's ``RunContext`` and ``Plan``; ``isolation`` runs the sensitivity."""
    step_passes = {step_id: step.pass_cls.name for step_id, step in plan.steps.items()}
    step_classes = {step_id: step.pass_cls for step_id, step in plan.steps.items()}
    step_fixed = {step_id: dict(step.fixed) for step_id, step in plan.steps.items()}
    probes: dict[tuple[str, ...], SensitivityProbe] = {}
    options = options if options is not None else {}
    capabilities: dict[tuple[tuple[str, ...] | None, str], ModelCapability] = {}

    def capability(op_types: Sequence[str] | None, mode: str, upstream: Sequence[str] = ()) -> ModelCapability:
        """The groups of the model the quant step reads: a fallback must name nodes the quantizer sees."""
        steps = tuple(upstream) if any(_trait(step_classes, s, "restructuring") for s in upstream) else ()
        key = (tuple(op_types) if op_types is not None else None, mode, steps)
        if key not in capabilities:
            capabilities[key] = ModelCapability.from_model(_quant_input(context, plan, steps), op_types, mode)
        return capabilities[key]

    axis = provider_step(plan.steps)  # a run that searches providers ranks on each its own way
    reference = plan.steps[axis].fixed.get("reference", CPU) if axis else CPU

    def sensitivity(point: Point, flow: tuple[str, ...]) -> Mapping[str, float]:
        """Node scores for the flow's quantization at ``point``, as the provider it runs on runs it."""
        quant = next((s for s in flow if _trait(step_classes, s, "quantizes")), None)
        if quant is None or context.calibration is None:
            return {}
        probe = probes.get(flow)
        if probe is None:
            probe = probes[flow] = SensitivityProbe(
                model_path=context.start.path,  # trials start from the prepared model
                model_sha=context.start.sha256,
                flow=tuple(flow),
                quant_step=quant,
                configs_for=lambda p, steps: plan.configs_for(p, steps),
                calibration=context.calibration,
                input_names=list(context.evaluator.input_names),
                batch_size=context.batch_size,
                cache=context.cache,
                rows=options_as(options, AccuracyOptions).sensitivity_rows,
                dynamic=_trait(step_classes, quant, "quantizes") == "dynamic",  # weight_only: by its int8 proxy
                isolation=isolation,
                eval_rows=len(context.evaluator.dataset),
            )
        backend = context.evaluator.backend
        provider = str(point.get(f"{axis}.provider", reference) if axis else backend.provider)
        return probe.on_provider(point, provider, backend, context.evaluator.threads)

    costs: dict[str, float] | None = None

    def node_costs() -> Mapping[str, float]:
        """Each node's share of the original's kernel time, profiled once (cached by model and batch)."""
        nonlocal costs
        if costs is None:
            costs = measure_profile(context)
        return costs

    def latency_ratio(point: Point, flow: tuple[str, ...]) -> float | None:
        """The point's model latency over the original's, timed interleaved (cached per model pair)."""
        try:
            return variant_ratio(context, plan, point, flow)
        except Exception as exc:  # a failed timing leaves the decision to the trial's own figure
            log.warning("side-by-side timing failed (%s); using the trial's own latency", exc)
            return None

    def paired_latency(
        candidate: Point,
        candidate_flow: tuple[str, ...],
        reference: Point,
        reference_flow: tuple[str, ...],
        limit: float | None = None,
    ) -> Mapping[str, Any] | None:
        """One model timed against another side by side; None when it fails. No round past ``limit``."""
        from quantune.engine.measure.paired_timing import paired_latency as timed

        try:
            pair = (candidate, candidate_flow), (reference, reference_flow)
            return timed(context, *pair, variant_builder(context, plan), limit=limit)
        except Exception as exc:  # no paired answer: the strategy keeps what it has
            log.warning("paired timing failed (%s)", exc)
            return None

    return {
        "paired_latency": paired_latency,
        "ceiling_ratios": partial(time_ceilings, context, plan),  # every model against the original, one session
        "capability": capability,
        "step_passes": step_passes,
        "step_fixed": step_fixed,
        "sensitivity": sensitivity,
        "options": options,
        "node_costs": node_costs,
        "latency_ratio": latency_ratio,
    }


CEILING_ROUNDS = 20  # interleaved rounds timing a speed ceiling against the original


def _trait(step_classes: Mapping[str, Any], step: str, trait: str) -> Any:
    """A trait of the step's pass (None for an unknown step)."""
    cls = step_classes.get(step)
    return getattr(cls, trait) if cls is not None else None


def _quant_input(context: Any, plan: Any, steps: tuple[str, ...]) -> Any:
    """The model a quant step after ``steps`` reads: the start model when there are none, or when they fail."""
    if not steps:
        return context.start.path
    try:
        path, _ = variant_model(context, plan, {}, steps, label=" (capability)")
    except Exception as exc:
        log.warning("the groups of %s's output are those of its input: the passes failed (%s)", steps, exc)
        return context.start.path
    return path


def variant_ratio(context: Any, plan: Any, point: Point, flow: tuple[str, ...]) -> float | None:
    """Runs the point's passes (cache hits: its trial ran them) and times its model against the original."""
    path, sha = variant_model(context, plan, point, flow)
    spec = context.evaluator.spec.latency
    # a ceiling only sorts variants (3% margin): 20 paired rounds tell it; 50+10 ate a large model's limit
    warmup, repeats = min(spec.warmup, 2), min(spec.repeats, CEILING_ROUNDS)
    key = cache_key(
        "side-by-side",
        context.model.sha256,
        sha,
        vars(spec),
        warmup,
        repeats,
        context.evaluator.dataset.fingerprint,
        context.evaluator.backend.fingerprint(),  # a ceiling is per provider: timed on the target
    )
    cached = context.cache.get_json("evals", key)
    if cached is not None:
        return cached["ratio"]
    timings = context.evaluator.timings_side_by_side([context.model.path, path], warmup=warmup, repeats=repeats)
    ratio = paired_ratio(timings[1], timings[0]).median  # per-round ratios cancel the machine's drift
    context.cache.put_json("evals", key, {"ratio": ratio})
    return ratio


def variant_builder(context: Any, plan: Any) -> Any:
    """A point's model (path, hash) for the paired timing: its passes through the cache."""
    return lambda point, flow: variant_model(context, plan, point, flow, label=" (paired)")


def variant_model(
    context: Any, plan: Any, point: Point, flow: tuple[str, ...], label: str = " (speed ceiling)"
) -> tuple[Any, str]:
    """The point's model: its flow's passes run from the trials' start model (cached)."""
    return run_flow_cached(
        context.cache,
        [(step.id, step.pass_cls, config) for step, config in plan.configs_for(point, flow)],
        context.start.path,
        context.start.sha256,
        calibration=context.calibration,
        input_names=list(context.evaluator.input_names),
        batch_size=context.batch_size,
        label_suffix=label,
        timing=timing_for(context.evaluator),
    )


def time_ceilings(
    context: Any,
    plan: Any,
    items: Sequence[tuple[Point, tuple[str, ...]]],
    threshold: float,
    budget_s: float | None,
    limit: float | None = None,
    pairs: Sequence[tuple[int, int]] = (),
    anchor: int | None = None,
) -> list[float | None]:
    """Builds each point's model (until ``budget_s``; at least one), then times them all with the original in one
    session that stops once each ratio is decided at ``threshold``; the median ratios. ``pairs``: companions;
    ``anchor``: a model already in budget."""
    started = time.perf_counter()
    deadline = None if not budget_s else started + budget_s
    built: list[tuple[int, Any, str]] = []
    for index, (point, flow) in enumerate(items):
        if deadline is not None and built and time.perf_counter() >= deadline:
            log.info("speed ceilings: time budget (%.0f s) spent after %d of %d variants", budget_s, index, len(items))
            break
        try:
            path, sha = variant_model(context, plan, point, flow)
        except Exception as exc:  # a variant that does not quantize is dropped, not the run
            log.warning("speed ceiling %s: the passes failed (%s)", dict(point), exc)
            continue
        built.append((index, path, sha))
    ratios: list[float | None] = [None] * len(items)
    if not built:
        return ratios
    # Variants that are one model are timed once and share the ratio.
    twins = {index: next(i for i, _, s in built if s == sha) for index, _, sha in built}
    built = [entry for entry in built if twins[entry[0]] == entry[0]]
    rows = {index: row for row, (index, _, _) in enumerate(built, start=1)}  # item -> its row in the rounds
    sha_of = {row: sha for row, (_, _, sha) in enumerate(built, start=1)}
    paired = [  # (row, reference row) of the companions both built; twins share a row: one model
        (rows[twins[item]], rows[twins[ref]]) for item, ref in pairs if item in twins and ref in twins
    ]
    paired = [(row, ref) for row, ref in paired if row != ref]
    anchored = rows[twins[anchor]] if anchor is not None and anchor in twins else None
    spec = context.evaluator.spec.latency
    # a companion's rounds are a paired timing's (engine/measure/paired_timing.py): at least its fewest
    most = max(PAIRED_MIN_ROUNDS if paired else 1, min(spec.repeats, CEILING_ROUNDS))
    backend = context.evaluator.backend  # the target's provider and build, as every other timing
    key = cache_key(
        "ceilings",
        2,  # with the "unsure" marks
        context.model.sha256,
        [sha for _, _, sha in built],
        vars(spec),
        threshold,
        context.evaluator.dataset.fingerprint,
        backend.fingerprint(),  # ceilings are per provider: timed on the target
        paired,
        anchored,
    )
    cached = context.cache.get_json("evals", key)
    if cached is None:
        feeds = getattr(context.evaluator, "_latency_feeds", None)
        with progress.stage("speed_ceiling"):
            request = TimingRequest(
                (context.model.path, *(path for _, path, _ in built)),
                feeds,
                spec,
                context.evaluator.spec.runner,
                threshold=threshold,
                min_rounds=PAIRED_MIN_ROUNDS if paired else min(5, spec.repeats),
                max_rounds=most,
                deadline=None if deadline is None else max(deadline, time.perf_counter()),
                limit=limit,
                # the original's latency is read from these rounds (engine/run/original.py): enough of them
                original_rounds=RETIME_ROUNDS if getattr(context, "original_timed", None) is not None else 0,
                pairs=paired,
                early=True,  # a variant far slower than the margin sits out after two rounds
                anchor=anchored,
            )
            timings = backend.time(request)
        medians = ceiling_medians(timings, threshold)
        if (timed := getattr(context, "original_timed", None)) is not None:  # its first timing alone here
            context.original_timed = None
            timed(timings[0])
        cached = {
            "ratios": [None if m is None else float(m) for m in medians],
            "unsure": [isinstance(m, UnsureRatio) for m in medians],  # undecided at the threshold
            "each": [int(n) for n in (~np.isnan(timings[1:])).sum(axis=1)],  # rounds each variant ran
        }
        cached["rounds"] = max(cached["each"], default=0)  # (the original may have gone on alone)
        if limit is None or time.perf_counter() < limit:  # rounds cut by the run's limit are not for later runs
            context.cache.put_json("evals", key, cached)
            companions = {row for row, _ in paired}
            ceilings = [row for row in sha_of if row not in companions]  # each against each: _settle_first's
            ranked = [(row, other) for row in ceilings for other in ceilings if row != other]  # question
            store_pairs(context, timings, paired, sha_of, most)
            store_pairs(context, timings, ranked, sha_of, most, quiet=True)
    log.info(
        "speed ceilings: %d variants timed side by side in %d rounds (%.1f s; rounds per variant: %s)",
        len(built),
        cached["rounds"],
        time.perf_counter() - started,
        cached.get("each"),
    )
    unsure = cached.get("unsure") or [False] * len(built)
    for (index, _, _), ratio, tied in zip(built, cached["ratios"], unsure, strict=True):
        if ratio is not None:  # None: onnxruntime could not run it
            ratios[index] = UnsureRatio(ratio) if tied else float(ratio)
    for index, first in twins.items():
        ratios[index] = ratios[first]
    return ratios


def cached_ceilings(
    context: Any,
    plan: Any,
    items: Sequence[tuple[Point, tuple[str, ...]]],
    threshold: float,
    budget_s: float | None,
    limit: float | None = None,
    pairs: Sequence[tuple[int, int]] = (),
    anchor: int | None = None,
) -> list[float | None] | None:
    """:func:`time_ceilings` here when every point's model is cached; ``None`` when a model is missing."""
    from quantune.passes.cached import NotCached, only_cached

    try:
        with only_cached():
            for point, flow in items:
                variant_model(context, plan, point, flow)
    except NotCached:
        return None
    except Exception:  # a variant that failed: the stage says so as it always did
        return None
    with only_cached():
        return time_ceilings(context, plan, items, threshold, budget_s, limit, pairs, anchor)


def _profile_key(context: Any) -> tuple[dict[str, Any] | None, str]:
    feeds = getattr(context.evaluator, "latency_feeds", None) or getattr(context.evaluator, "_latency_feeds", None)
    if not feeds:
        return None, ""
    shapes = sorted((name, list(np.shape(value))) for name, value in feeds.items())
    return feeds, cache_key("node-profile", 2, context.start.sha256, shapes, context.evaluator.spec.latency.threads)


def cached_profile(context: Any) -> dict[str, float] | None:
    """The original's node profile when the cache holds it (profiled beside its evaluation, engine/measure/prebuild.py)."""
    feeds, key = _profile_key(context)
    cached = context.cache.get_json("profiles", key) if feeds else None
    return None if cached is None else dict(cached["shares"])


def measure_profile(context: Any) -> dict[str, float]:
    feeds, key = _profile_key(context)
    if not feeds:
        return {}
    if (cached := cached_profile(context)) is not None:
        return cached
    try:
        shares = node_time_shares(context.start.path, feeds, threads=context.evaluator.spec.latency.threads)
    except Exception as exc:  # a profile is a hint for ordering, never a reason to fail the run
        log.warning("per-node profile of the original failed (%s); fallbacks are ordered by sensitivity alone", exc)
        return {}
    context.cache.put_json("profiles", key, {"shares": shares})
    return shares
