"""The report's text sections: the verdict, the machine, and the chosen model's precision map."""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quantune.engine.outcome.result import Result
from quantune.engine.trials.trial import TrialRecord
from quantune.report.plots import chosen_trial
from quantune.report.precision import (
    Fallback,
    fallbacks,
    op_precisions,
    overridden,
    recovered,
    recovery_steps,
)
from quantune.report.speed import speed_of
from quantune.report.study import objective_name, objective_value
from quantune.wording import format_loss, format_ratio

_VERDICTS = {
    "improved": ("good", "improved: use the best model"),
    "unconfirmed": ("warn", "unconfirmed: faster during the search, not yet timed side by side"),
    "keep_original": ("warn", "keep the original: no candidate was faster beyond the noise"),
    "no_candidate_in_budget": ("bad", "no candidate met the accuracy budget"),
}


def loss_text(loss: float | None, kind: str | None) -> str:
    """An accuracy loss with the digits that matter: +0.0459% rather than +0.05%, +0.0001% not +0.00%."""
    if loss is None:
        return ""
    if kind == "relative":
        return f"{100 * loss:+.3g}%"
    return format_loss(loss, kind)


def e(text: Any) -> str:
    return html.escape(str(text))


def verdict(results: Result) -> str:
    css, words = _VERDICTS.get(results.verdict, ("warn", str(results.verdict)))
    return f'<div class="verdict {css}"><b>{e(words)}</b><br>{e(results.verdict_reason)}</div>'


def summary(results: Result) -> str:
    metric = results.metric
    base = results.baseline
    criterion = results.criterion
    lines = [
        f"criterion: {metric} {criterion.describe()}; objective: {results.objective}",
        f"original: {metric} {base.get(metric, float('nan')):.4f}, latency {base.get('latency_ms', float('nan')):.3f} ms, "
        f"size {base.get('size_bytes', 0) / 1024:.0f} KB",
        f"stop: {results.stop_reason} after {results.duration_s:.1f} s, {len(results.trials)} trials",
    ]
    spent = results.time_spent_s or {}
    if spent:
        lines.append("time: " + ", ".join(f"{name} {sec:.1f} s" for name, sec in spent.items() if sec >= 0.05))
    chosen, kind = chosen_trial(results)
    if chosen is not None and chosen.metrics:
        m = chosen.metrics
        lines.append(
            f"{kind}: trial {chosen.number}, {metric} {m.get(metric, float('nan')):.4f} "
            f"(loss {loss_text(chosen.accuracy_loss, criterion.kind)}), latency "
            f"{m.get('latency_ms', float('nan')):.3f} ms ({speed_of(results, chosen)}), size "
            f"{m.get('size_bytes', 0) / 1024:.0f} KB "
            f"({format_ratio(m.get('size_bytes', 0), base.get('size_bytes', 0), less='smaller', more='larger')}); "
            f"flow {' > '.join(chosen.flow)}"
        )
    for name, count in (results.failure_classes or {}).items():
        lines.append(f"failed {count}x: {name}")
    if results.skipped_known_failures:
        lines.append(f"not run: {results.skipped_known_failures} proposal(s) shared a known failure")
    for line in (results.strategy_notes or {}).get("decisions") or []:
        lines.append(f"strategy: {line}")
    for failure in results.stage_errors or []:
        lines.append(f"stage {failure['stage']} failed: {failure['error']} (the run went on without it)")
    if results.latency_confirmation:
        lines.append("latencies marked * were timed again at the end, side by side with the original")
    return "<ul>" + "".join(f"<li>{e(line)}</li>" for line in lines) + "</ul>"


def environment(results: Result) -> str:
    env = results.environment
    if not env:
        return "<p class=dim>This run's results.json predates the machine record (no CPU or versions).</p>"
    versions = ", ".join(f"{k} {v}" for k, v in (env.get("versions") or {}).items() if v)
    flags = ", ".join(env.get("cpu_flags") or []) or "none of the listed"
    vnni = [f for f in env.get("cpu_flags") or [] if "vnni" in f or f.startswith("amx") or f in ("asimddp", "i8mm")]
    rows = [
        ("CPU", env.get("cpu_model", "")),
        (
            "cores",
            f"{env.get('usable_cores')} usable, {env.get('logical_cores')} logical, "
            f"{env.get('physical_cores') or '?'} physical",
        ),
        ("speed-relevant flags", flags),
        (
            "int8 dot-product instructions",
            ", ".join(vnni) if vnni else "none (no VNNI/AMX/dot-product: int8 gains are smaller)",
        ),
        ("system", f"{env.get('os', '')}, {env.get('machine', '')}, Python {env.get('python', '')}"),
        ("versions", versions),
    ]
    return "<table class=kv>" + "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in rows) + "</table>"


def chosen_model(results: Result, run_dir: Path) -> tuple[Path | None, TrialRecord | None, str]:
    """The chosen (or best, or closest-miss) trial's model file, the trial, and what it is."""
    chosen, kind = chosen_trial(results)
    if chosen is None:
        return None, None, ""
    folder = "closest_miss" if kind == "closest miss" else "best"
    for path in (run_dir / folder / "model.onnx", Path(str(chosen.model_path or "")).expanduser()):
        if path.is_file() and path.suffix == ".onnx":
            return path, chosen, kind
    return None, chosen, kind


def precision_section(
    results: Result, run_dir: Path, types: Mapping[str, str]
) -> tuple[str, dict[str, dict[str, int]]]:
    """The precision map's HTML and the counts its bar chart draws (empty when there is no model)."""
    path, chosen, kind = chosen_model(results, run_dir)
    if chosen is None:
        return "<p>No trial finished, so there is no model to map.</p>", {}
    if path is None:
        return f"<p>The {e(kind)}'s model (trial {chosen.number}) is no longer on disk: no precision map.</p>", {}
    try:
        ops = op_precisions(path)
    except Exception as exc:
        return f"<p>The {e(kind)}'s model could not be read ({e(exc)}).</p>", {}
    from quantune.report.precision import precision_counts

    falls = fallbacks(results, chosen)
    by_node = {f.node: f for f in falls}
    recovery, recovered_nodes = recovered(results, chosen)
    int16 = set(overridden(chosen.params))
    tolerable = results.criterion.tolerable_loss
    rows = []
    for op in ops:
        why = _why(by_node.get(op.original) or by_node.get(op.name), results, tolerable)
        if not why and op.precision in ("fp32", "fp16", "bf16"):
            why = "not quantized by the flow's passes (not excluded by the search)"
        if not why and (op.original in recovered_nodes or op.name in recovered_nodes):
            why = e(recovered_nodes.get(op.original) or recovered_nodes[op.name])
        if int16 and any(t in int16 for t in (op.name, op.original)):
            why = (why + "; " if why else "") + "int16 override"
        css = "float" if op.precision in ("fp32", "fp16", "bf16") else "int"
        rows.append(
            f"<tr class={css}><td>{e(op.original)}</td><td>{e(op.op_type)}</td><td><b>{e(op.precision)}</b></td>"
            f"<td>{e(op.detail)}</td><td>{why}</td></tr>"
        )
    counts = precision_counts(ops)
    head = (
        f"<p>{e(kind)}: trial {chosen.number}, read from <code>{e(path)}</code>: {len(ops)} compute ops, "
        f"{sum(1 for o in ops if o.precision not in ('fp32', 'fp16', 'bf16'))} in integer precision"
        f"{'; ' + e(recovery) if recovery else ''}.</p>"
    )
    table = (
        f"<details{' open' if len(ops) <= 60 else ''}><summary>every compute op ({len(ops)})</summary><div class=scroll><table class=ops><thead><tr><th>node</th>"
        "<th>op</th><th>precision</th><th>detail</th><th>why it is in this precision</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></div></details>"
    )
    return head + table + _fallback_table(falls, results, tolerable, types), counts


def _why(fall: Fallback | None, results: Result, tolerable: float | None) -> str:
    if fall is None:
        return ""
    parts = ["kept in fp32 by the search"]
    if fall.score is not None and fall.rank is not None:
        parts.append(f"sensitivity {fall.score:.3g} (rank {fall.rank} of {fall.groups_ranked})")
    elif fall.group is not None:
        parts.append("sensitivity not measured")
    proof = fall.evidence
    if proof is not None:
        kind = results.criterion.kind
        loss = loss_text(proof["accuracy_loss"], kind)
        budget = "" if tolerable is None else f" > budget {loss_text(tolerable, kind)}"
        extra = f", {proof['other_differences']} other node(s) differing" if proof["other_differences"] else ""
        if not proof.get("same_settings", True):
            extra += ", other quantization settings"
        parts.append(
            f"trial {proof['number']} ({e(proof['stage'])}) quantized it and missed: loss {e(loss)}{e(budget)}{e(extra)}"
        )
    else:
        parts.append("no finished trial quantized it alone (kept with its op type or block)")
    return "; ".join(parts)


def _fallback_table(
    falls: list[Fallback],
    results: Result,
    tolerable: float | None,
    types: Mapping[str, str],
) -> str:
    if not falls:
        return "<p>The search kept no node in higher precision (no fallback).</p>"
    rows = "".join(
        f"<tr><td>{e(f.node)}</td><td>{e(types.get(f.node, ''))}</td><td>{e(f.group or '')}</td>"
        f"<td>{_why(f, results, tolerable)}</td></tr>"
        for f in falls
    )
    return (
        f"<h3>{len(falls)} node(s) kept in fp32 (every node of the fallback, compute or not)</h3>"
        "<details><summary>the fallbacks and their reasons</summary><div class=scroll><table class=ops><thead><tr>"
        "<th>node</th><th>op</th><th>group</th><th>why</th></tr></thead><tbody>"
        + rows
        + "</tbody></table></div></details>"
    )


def recovery_section(results: Result) -> str:
    """Each accuracy-recovering step the strategy tried, with what it gave."""
    steps = recovery_steps(results)
    if not steps:
        return "<p>No accuracy-recovering step was needed or tried (no screen, op-type, bisection or prune stage).</p>"
    kind = results.criterion.kind
    rows = []
    for t in steps:
        m = t.metrics or {}
        value = objective_value(results, m)
        held = {True: "meets", False: "misses"}.get(t.meets_criterion, "failed")
        rows.append(
            f"<tr class={held}><td>{t.number}</td><td>{e(t.stage)}</td><td>{held}</td>"
            f"<td>{e(loss_text(t.accuracy_loss, kind))}</td><td>{'' if value is None else f'{value:.4g}'}</td>"
            f"<td>{e(_fraction(m))}</td></tr>"
        )
    return (
        f"<table class=ops><thead><tr><th>#</th><th>step</th><th>budget</th><th>loss</th>"
        f"<th>{e(objective_name(results))}</th><th>quantized</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _fraction(metrics: Mapping[str, Any]) -> str:
    if "quantized_compute_fraction" not in metrics:
        return ""
    return f"{metrics['quantized_compute_fraction']:.0%}"
