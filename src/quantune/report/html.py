"""``report.html``: one self-contained page a person can open or send, built from results.json.

It reads only the run folder's ``results.json``, so it works for any finished (or
interrupted) run, on any machine, without the cache. The plots are PNGs embedded in the page
(no files beside it to lose): accuracy loss against the objective for every trial, with the
budget and the chosen model marked, and the best-so-far over the trials. matplotlib is an
optional dependency (``pip install 'quantune[report]'``).
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from pathlib import Path
from typing import Any

from quantune.errors import QuantuneError
from quantune.report.result import format_loss, format_ratio, speed_words
from quantune.store.faults import storage_errors

_UNITS = {"latency": ("latency_ms", "latency (ms, median)"), "size": ("size_bytes", "size (KB)")}


def write_report(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Writes ``report.html`` for the run in ``run_dir`` (or to ``output``) and returns its path."""
    run_dir = Path(run_dir)
    path = run_dir / "results.json"
    try:
        results = json.loads(path.read_text())
    except FileNotFoundError:
        raise QuantuneError(f"report: no results.json in '{run_dir}' (give the --output folder of a run)") from None
    except ValueError as exc:
        raise QuantuneError(f"report: '{path}' is not valid JSON ({exc})") from None
    if not isinstance(results, dict) or "trials" not in results or "baseline" not in results:
        raise QuantuneError(f"report: '{path}' is not a quantune results.json (no 'trials' or 'baseline')")
    target = Path(output) if output is not None else run_dir / "report.html"
    page = render_html(results)
    field = "report --output" if output is not None else "report"
    if target.is_dir():
        raise QuantuneError(f"{field}: '{target}' is a folder; name the file to write, e.g. '{target / 'report.html'}'")
    try:
        with storage_errors(target, field):
            target.parent.mkdir(parents=True, exist_ok=True)  # a new folder for the page is made
            tmp = target.with_name(f".{target.name}.tmp")
            try:
                tmp.write_text(page)
                os.replace(tmp, target)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
    except OSError as exc:  # e.g. a file where a parent folder should be
        raise QuantuneError(f"{field}: cannot write '{target}' ({exc.strerror or exc})") from None
    return target


def render_html(results: dict[str, Any]) -> str:
    """The page for one results.json."""
    plots = [_plot_png(_trade_off, results), _plot_png(_progress, results)]
    images = "".join(
        f'<img alt="{alt}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        for alt, png in zip(("accuracy loss against the objective", "best so far"), plots, strict=True)
    )
    return _PAGE.format(
        title=html.escape(f"quantune: {results.get('metric', '')}, {len(results['trials'])} trials"),
        summary=_summary(results),
        images=images,
        table=_table(results),
    )


def _objective(results: dict[str, Any]) -> tuple[str, str, float]:
    metric, label = _UNITS.get(results.get("objective", "latency"), _UNITS["latency"])
    return metric, label, 1 / 1024 if metric == "size_bytes" else 1.0


def _ok(results: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in results["trials"] if t.get("status") == "ok" and t.get("accuracy_loss") is not None]


def _trade_off(ax: Any, results: dict[str, Any]) -> None:
    metric, label, scale = _objective(results)
    trials = _ok(results)
    for meets, color, name in ((True, "tab:green", "meets the budget"), (False, "tab:gray", "misses it")):
        chosen = [t for t in trials if bool(t.get("meets_criterion")) is meets]
        ax.scatter(
            [t["metrics"][metric] * scale for t in chosen],
            [100 * t["accuracy_loss"] for t in chosen],
            c=color,
            s=28,
            label=f"{name} ({len(chosen)})",
        )
    base = results["baseline"].get(metric)
    if base is not None:
        ax.axvline(base * scale, color="tab:blue", linestyle=":", label="original")
    criterion = results.get("criterion", {})
    if criterion.get("type") == "relative":
        ax.axhline(100 * criterion.get("tolerable_loss", 0), color="tab:red", linestyle="--", label="budget")
    best = results.get("best")
    if best:
        ax.scatter(
            [best["metrics"][metric] * scale],
            [100 * best["accuracy_loss"]],
            marker="*",
            s=260,
            c="gold",
            edgecolors="black",
            label=f"{'best' if results.get('verdict', 'improved') == 'improved' else 'best candidate'} (trial {best['number']})",
            zorder=3,
        )
    ax.set_xlabel(label)
    ax.set_ylabel("accuracy loss (% of the original)" if criterion.get("type") == "relative" else "accuracy loss")
    ax.set_title("every trial")
    ax.legend(fontsize=8)


def _progress(ax: Any, results: dict[str, Any]) -> None:
    metric, label, scale = _objective(results)
    numbers, best_so_far, current = [], [], None
    for trial in sorted(results["trials"], key=lambda t: t["number"]):
        if trial.get("status") == "ok" and trial.get("meets_criterion"):
            value = trial["metrics"][metric] * scale
            current = value if current is None else min(current, value)
        numbers.append(trial["number"])
        best_so_far.append(current if current is not None else float("nan"))
    ax.step(numbers, best_so_far, where="post", color="tab:green")
    base = results["baseline"].get(metric)
    if base is not None:
        ax.axhline(base * scale, color="tab:blue", linestyle=":", label="original")
        ax.legend(fontsize=8)
    ax.set_xlabel("trial")
    ax.set_ylabel(f"best {label} within the budget")
    ax.set_title("best so far")


def _plot_png(draw: Any, results: dict[str, Any]) -> bytes:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise QuantuneError("report: plots need matplotlib: pip install 'quantune[report]'") from None
    figure, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    try:
        draw(ax, results)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        return buffer.getvalue()
    finally:
        plt.close(figure)


def _summary(results: dict[str, Any]) -> str:
    metric = results.get("metric", "")
    base = results["baseline"]
    criterion = results.get("criterion", {})
    lines = [
        f"criterion: {metric} {criterion.get('description', '')}; objective: {results.get('objective', '')}",
        f"original: {metric} {base.get(metric, float('nan')):.4f}, latency {base.get('latency_ms', float('nan')):.3f} ms, "
        f"size {base.get('size_bytes', 0) / 1024:.0f} KB",
        f"stop: {results.get('stop_reason', '')} after {results.get('duration_s', 0):.1f} s",
    ]
    if results.get("verdict"):
        lines.append(f"verdict: {results['verdict']} ({results.get('verdict_reason', '')})")
    best = results.get("best")
    if best:
        m = best["metrics"]
        improved = results.get("verdict", "improved") == "improved"
        lines.append(
            f"best: trial {best['number']}{'' if improved else ' (a candidate only: the original stays the answer)'}, "
            f"{metric} {m.get(metric, float('nan')):.4f}, latency "
            f"{m['latency_ms']:.3f} ms ({speed_words(results, best)}), size "
            f"{m['size_bytes'] / 1024:.0f} KB "
            f"({format_ratio(m['size_bytes'], base.get('size_bytes', 0), less='smaller', more='larger')}); "
            f"flow {' > '.join(best.get('flow', []))}"
        )
    else:
        lines.append("no trial met the criterion")
    for name, count in (results.get("failure_classes") or {}).items():
        lines.append(f"failed {count}x: {name}")
    if results.get("skipped_known_failures"):
        lines.append(f"not run: {results['skipped_known_failures']} proposal(s) shared a known failure")
    if results.get("latency_confirmation"):
        lines.append("latencies marked * were timed again at the end, side by side with the original")
    peaks = [t["peak_rss_mb"] for t in results.get("trials", []) if t.get("peak_rss_mb")]
    stages = results.get("stage_peak_rss_mb") or {}
    if peaks or stages:
        parts = [f"trials {max(peaks):.0f} MB"] if peaks else []
        parts += [f"{stage.replace('_', ' ')} {mb:.0f} MB" for stage, mb in stages.items()]
        lines.append(f"peak memory: {', '.join(parts)}")
    for failure in results.get("stage_errors") or []:
        lines.append(f"stage {failure['stage']} failed: {failure['error']} (the run went on without it)")
    return "".join(f"<li>{html.escape(line)}</li>" for line in lines)


def _table(results: dict[str, Any]) -> str:
    best = (results.get("best") or {}).get("number")
    head = "".join(
        f"<th>{html.escape(c)}</th>"
        for c in ("#", "flow", "params", results.get("metric", ""), "loss", "ms", "KB", "quantized", "meets", "error")
    )
    rows = []
    for trial in results["trials"]:
        m = trial.get("metrics", {})
        loss = trial.get("accuracy_loss")
        cells = [
            str(trial["number"]),
            " > ".join(trial.get("flow", [])),
            ", ".join(f"{k.split('.', 1)[-1]}={v}" for k, v in trial.get("params", {}).items()),
            f"{m[results['metric']]:.4f}" if results.get("metric") in m else "",
            format_loss(loss, results.get("criterion", {}).get("type")),
            f"{m['latency_ms']:.3f}{'*' if 'latency_search_ms' in m else ''}" if "latency_ms" in m else "",
            f"{m['size_bytes'] / 1024:.0f}" if "size_bytes" in m else "",
            _quantized(m),
            {True: "yes", False: "no"}.get(trial.get("meets_criterion"), ""),
            (trial.get("error") or "")[:160],
        ]
        style = (
            ' class="best"' if trial["number"] == best else (' class="failed"' if trial.get("status") != "ok" else "")
        )
        rows.append(f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _quantized(metrics: dict[str, Any]) -> str:
    if "quantized_ops" not in metrics:
        return ""
    if not metrics["quantized_ops"]:
        return "none (a copy of the original)"
    return f"{metrics['quantized_ops']:.0f} ({metrics.get('quantized_compute_fraction', 0.0):.0%})"


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
img {{ max-width: 48%; margin: 0.5em 1% 0.5em 0; border: 1px solid #ddd; }}
table {{ border-collapse: collapse; font-size: 0.85em; }}
td, th {{ border: 1px solid #ddd; padding: 0.25em 0.5em; text-align: left; }}
tr.best {{ background: #fff6c8; font-weight: bold; }}
tr.failed {{ color: #a33; }}
</style></head>
<body><h1>{title}</h1><ul>{summary}</ul>{images}<h2>trials</h2>{table}</body></html>
"""
