"""The oracle's truth table as markdown (bench/oracle.py writes it beside the JSON)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _worst(units: list[str]) -> str:
    if not units:
        return "none (no unit loses more than another alone)"
    return ", ".join(units[:3]) + (" ..." if len(units) > 3 else "")


def _ratio(speed: float | None) -> str:
    """A speed-up over the original (> 1: faster) as a factor, "-" when not measured."""
    return "-" if speed is None else f"{speed:.2f}x"


def markdown(table: dict[str, Any], command: str) -> str:
    def fmt(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, float):
            return f"{value:+.4f}" if abs(value) < 10 else f"{value:.1f}"
        return str(value)

    full = table["full_int8"] or {}
    lines = [
        f"# oracle: {Path(table['model']).name}",
        "",
        f"`{command}` -- metric `{table['metric']}`, criterion {table['criterion']}, "
        f"{table['evaluations']} evaluations; original {table['original']}.",
        "",
        f"Fully int8: loss {fmt(full.get('loss'))}, meets {fmt(full.get('meets'))}, "
        f"speed {_ratio(full.get('speed'))} the original's (search-time timings, not re-timed side by side). A single unit in fp32 that meets the budget "
        f"and is faster than the original: {', '.join(table['single_fallback_in_budget_and_faster']) or 'none'}.",
        "",
        "| unit | op type | nodes | head | lead-in | loss alone int8 | loss alone fp32 | meets alone fp32 | speed alone fp32 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(table["units"], key=lambda r: -(r["loss_alone_int8"] or 0.0)):
        speed = _ratio(r["speed_alone_fp32"])
        lines.append(
            f"| {r['unit']} | {r['op_type']} | {r['nodes']} | {fmt(r['head'])} | {fmt(r.get('lead_in', False))} | {fmt(r['loss_alone_int8'])} | "
            f"{fmt(r['loss_alone_fp32'])} | {fmt(r['meets_alone_fp32'])} | {speed} |"
        )
    best, accurate = table.get("in_budget_faster"), table.get("most_accurate_faster")
    lines += [
        "",
        "Oracle search (the worst units alone int8 put in fp32, 1, 2, 4, ...): "
        + "; ".join(
            f"{r['stage']}: loss {fmt(r['loss'])}, meets {fmt(r['meets'])}, {_ratio(r['speed'])}"
            for r in table.get("search", [])
        )
        + ".",
        "",
        "**Oracle verdict** (search-time timings, every model built): "
        + (
            f"an in-budget model faster than the original exists: `{best['stage']}`, loss {fmt(best['loss'])}, {_ratio(best['speed'])}"
            if best
            else "no model the oracle built meets the budget and is faster than the original"
        )
        + (
            f". Most accurate model faster than the original: `{accurate['stage']}`, loss {fmt(accurate['loss'])}, {_ratio(accurate['speed'])}."
            if accurate
            else "."
        ),
    ]
    lines += [
        "",
        "Re-timed side by side with the original (interleaved, 30 rounds, 1 thread; `ratio` < 1: faster):",
        "",
    ]
    lines += [
        f"- `{r['stage']}`: loss {fmt(r['loss'])}, meets {fmt(r['meets'])}, {r['chosen_ms']} vs {r['original_ms']} ms (ratio {r['ratio']})"
        for r in table.get("retimed", [])
    ] or ["- nothing to re-time"]
    faster = [r for r in table.get("retimed", []) if r["meets"] and r["ratio"] < 1.0]
    lines += [
        "",
        "**Re-timed verdict**: "
        + (
            f"an in-budget model faster than the original exists: `{faster[0]['stage']}` (ratio {faster[0]['ratio']})"
            if faster
            else "no in-budget model the oracle built re-times faster than the original"
        )
        + ".",
    ]
    lines += ["", "| ranking | Spearman | worst unit(s) | its rank | in top 1 | in top 3 | in top 5 |"]
    lines.append("| --- | --- | --- | --- | --- | --- | --- |")
    for kind, s in table["rankings"].items():
        rho = "-" if s["spearman"] is None else f"{s['spearman']:.3f}"
        lines.append(
            f"| {kind} | {rho} | {_worst(s['worst_units'])} | "
            f"{fmt(s['worst_rank'])} | {fmt(s['worst_in_top_1'])} | {fmt(s['worst_in_top_3'])} | "
            f"{fmt(s['worst_in_top_5'])} |"
        )
    lines += ["", "Ranking orders (most sensitive first):", ""]
    lines += [f"- {kind}: {', '.join(s['order'])}" for kind, s in table["rankings"].items()]
    return "\n".join(lines) + "\n"
