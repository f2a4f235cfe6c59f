"""Where a run's models were evaluated and the fronts it found: the lines under the run's table."""

from __future__ import annotations

from quantune.report.result import Result, format_loss
from quantune.space.providers import short_provider


def target_lines(result: Result) -> list[str]:
    """Where the models were evaluated, each model's session memory, and a Pareto front's trials."""
    lines = []
    target = result.target
    if target:
        where = "a target environment" if target.get("isolated") else "this environment"
        lines.append(
            f"evaluated on {target['provider']}, onnxruntime {target['onnxruntime']}, {where} ({target['python']})"
        )
        if target.get("providers"):  # target.providers: where the candidates ran, and what was left out
            skipped = "".join(f"; {p} skipped: {why}" for p, why in (target.get("providers_skipped") or {}).items())
            lines.append(f"providers searched: {', '.join(target['providers'])}{skipped}")
            if front := result.provider_front:  # the front across providers
                by_number = {r.number: r for r in result.trials}
                lines.append(
                    f"fastest in budget per provider ({result.objective}, each trial's own figure): "
                    + ", ".join(f"{short_provider(p)} trial {n} {by_number[n].objective:.4g}" for p, n in front.items())
                )
    base_mb = result.baseline.get("peak_memory_mb")
    best_mb = result.best.metrics.get("peak_memory_mb") if result.best is not None else None
    if base_mb is not None and best_mb is not None:
        lines.append(f"session peak memory: best {best_mb:.1f} MB, original {base_mb:.1f} MB")
    if result.pareto_front:
        by_number = {r.number: r for r in result.trials}
        names = {"latency": "latency_ms", "size": "size_bytes", "memory": "peak_memory_mb"}
        shown = []
        for number in result.pareto_front:
            record = by_number[number]
            values = ", ".join(
                f"{name} {record.metrics.get(names[name], float('nan')):.4g}"
                if name in names
                else f"loss {format_loss(record.accuracy_loss, result.criterion.kind)}"
                for name in result.objectives
            )
            shown.append(f"  trial {number}: {values}")
        lines.append(f"Pareto front over {result.objectives} ({len(shown)} trials):")
        lines += shown
    return lines
