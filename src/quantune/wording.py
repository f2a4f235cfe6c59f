"""Figures as people read them: losses in percent, ratios as "2.10x faster", never "0.66x faster";
shared by the engine and the reports, so a figure reads the same wherever it is printed."""

from __future__ import annotations

from typing import Any


def format_loss(loss: float | None, kind: str | None) -> str:
    """An accuracy loss as people read it: percent of the original for a relative criterion."""
    if loss is None:
        return ""
    return f"{loss:+.2%}" if kind == "relative" else f"{loss:+.4g}"


def format_ratio(candidate: float, original: float, *, less: str = "faster", more: str = "slower") -> str:
    """``candidate`` against ``original`` as people read it: "2.10x faster", "1.50x slower", never
    "0.66x faster" (``less`` / ``more`` name the sides, e.g. "smaller" / "larger")."""
    if not (candidate > 0 and original > 0):
        return "no ratio"
    ratio = candidate / original
    factor = max(ratio, 1 / ratio)
    if round(factor, 2) <= 1.0:
        return "the same (1.00x)"
    return f"{factor:.2f}x {less if ratio < 1 else more}"


def speed_words(results: dict[str, Any], trial: dict[str, Any]) -> str:
    """A trial's speed against the original from a results.json dict: the median paired ratio when it was
    re-timed side by side, else the ratio of the medians."""
    ratio = ((results.get("latency_confirmation") or {}).get("ratios") or {}).get(str(trial["number"]))
    if ratio:
        return f"{format_ratio(ratio['ratio_median'], 1.0)} side by side"
    return format_ratio(trial["metrics"].get("latency_ms", 0.0), results["baseline"].get("latency_ms", 0.0))
