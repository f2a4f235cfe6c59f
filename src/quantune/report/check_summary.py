"""What ``quantune check`` found, in a few lines: the model, the data as quantune reads it, what
preparation changed, the original's figures and the size of the search space."""

from __future__ import annotations

from typing import Any

from quantune.data import Dataset
from quantune.evaluate.rows import budget_words


def describe_data(name: str, dataset: Dataset | None, batch_size: int, label_key: str) -> str:
    if dataset is None:
        return f"{name}: none"
    if dataset.is_table:
        batches = -(-len(dataset) // batch_size)
        what = f"a table of {len(dataset)} rows ({batches} batch(es) of up to {batch_size})"
    else:
        assert dataset.feeds is not None
        what = f"{len(dataset.feeds)} feeds, {len(dataset)} rows in all"
    arrays = ", ".join(dataset.names())
    label = f"; labels in '{label_key}'" if dataset.has(label_key) else ""
    return f"{name}: {what}; arrays {arrays}{label}"


def check_lines(parts: Any, metrics: dict[str, float]) -> list[str]:
    """The lines ``quantune check`` prints after the preflight passed (``parts``: engine RunParts)."""
    from quantune.space.report import pruned_size

    context = parts.context
    evaluator = context.evaluator
    spec = evaluator.spec
    lines = [
        f"model: {context.model.path.name}, inputs {', '.join(context.model.input_names())}",
        describe_data("calibration", context.calibration, context.batch_size, spec.label_key),
        describe_data("evaluation", evaluator.dataset, spec.batch_size, spec.label_key),
    ]
    preparation = context.preparation
    lines += [f"prepared: {step}" for step in (preparation.steps if preparation else [])]
    lines += [f"prepare: {warning}" for warning in (preparation.warnings if preparation else [])]
    metric = spec.metric
    label = metric.rpartition(":")[2] if ".py:" in metric else metric
    lines.append(
        f"original: {label} = {metrics[metric]:.6g}, latency {metrics.get('latency_ms', float('nan')):.3f} ms, "
        f"size {metrics.get('size_bytes', 0) / 1024:.0f} KB"
    )
    criterion = parts.criterion
    resolution = budget_words(criterion.kind, criterion.tolerable_loss, metric, metrics)
    if resolution:
        lines.append(f"criterion: {criterion.describe()}: {resolution}")
    plan = parts.plan
    for name in plan.flows:
        space = plan.flow_space(name)
        raw = space.raw_size()
        pruned, exact = pruned_size(space, raw)
        size = f"{pruned:,.0f}" + ("" if exact else " (estimated)")
        lines.append(f"search space: flow {name}: {size} point(s) over {len(space)} parameter(s)")
    return lines


def cost_lines(config: Any, parts: Any, evaluation_s: float, timing_s: float) -> list[str]:
    """What the original's evaluation and timing cost, and the run's time estimated from them: a trial
    calibrates (on the calibration rows, at an evaluation's cost a row), evaluates and times a candidate;
    sensitivity costs about two evaluations and the end re-times the original beside the best. The
    original's figures this check measured are cached, so the run does not measure it again."""
    if evaluation_s <= 0.0:
        return []  # the original's figures came from an older cache: no costs known
    context, stop = parts.context, config.stop
    rows = len(context.evaluator.dataset)
    calibrates = context.calibration is not None and any(
        s.pass_cls.needs_calibration for s in parts.plan.steps.values()
    )
    calibration_s = evaluation_s * len(context.calibration) / max(1, rows) if calibrates else 0.0
    trial_s = calibration_s + evaluation_s + timing_s
    fixed_s = 2.0 * (evaluation_s + timing_s)
    lines = [
        f"cost: one evaluation of the original takes {_seconds(evaluation_s)}, its timing {_seconds(timing_s)}; "
        f"a trial ~{_seconds(trial_s)} (calibration, evaluation, timing)"
    ]
    trials, limit = stop.max_trials, stop.timeout_s
    total = fixed_s + (trials or 0) * trial_s
    if limit and (not trials or limit < total):
        fit = max(0, int((limit - fixed_s) // trial_s))
        words = f"a run stops at stop.timeout_s = {limit:g} s, time for about {fit} trial(s)"
        more = f"; all {trials} (stop.max_trials) would need ~{_seconds(total)}" if trials else ""
        lines.append(f"{words}{more} (sensitivity and the end's re-timing: ~{_seconds(fixed_s)})")
    elif trials:
        lines.append(
            f"a run of {trials} trials (stop.max_trials) takes ~{_seconds(total)} "
            f"(sensitivity and the end's re-timing: ~{_seconds(fixed_s)})"
        )
    return lines


def _seconds(seconds: float) -> str:
    if seconds >= 90:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.2g} s"
