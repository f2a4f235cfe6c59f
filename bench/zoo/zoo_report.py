"""One zoo row from one run's results.json, and the markdown table of all rows.

results.json is read tolerantly: fields other helpers are adding (``verdict``,
``failure_classes``, ``failure_class``, ``peak_rss_mb``, ``quantized_compute_fraction``)
show as "-" when a run does not hold them. The latency ratio is not taken from the run: the
chosen model and the original are timed again here, interleaved round by round
(``quantune.evaluate.latency.measure_side_by_side``), on the run's first evaluation feed.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import yaml


def _first_feed(config: dict, base: Path, input_names: list[str]) -> dict[str, np.ndarray]:
    """The feed quantune times: the ``evaluation.latency.feed``-th evaluation feed (default 0)."""
    data = config["data"]
    source = str(data["evaluation"])
    index = int(config.get("evaluation", {}).get("latency", {}).get("feed", 0) or 0)
    batch = int(data.get("evaluation_batch_size") or data.get("batch_size") or 1)
    if ".py:" in source:
        from quantune.userimport import load_function

        produced = load_function(source, "data.evaluation", base)()
        if isinstance(produced, dict):
            return {n: np.asarray(produced[n])[:batch] for n in input_names}
        feed = list(produced)[index]
        return {n: np.asarray(feed[n]) for n in input_names}
    with np.load(base / source) as arrays:
        return {n: arrays[n][index * batch : (index + 1) * batch] for n in input_names}


def retime(config_path: Path, chosen: Path) -> dict[str, Any]:
    """Chosen and original, timed interleaved; ``ratio`` = chosen / original latency."""
    import onnxruntime as ort

    from quantune.evaluate.latency import LatencySpec, measure_side_by_side

    config = yaml.safe_load(config_path.read_text())
    original = config_path.parent / config["model"]
    names = [i.name for i in ort.InferenceSession(str(original), providers=["CPUExecutionProvider"]).get_inputs()]
    feed = _first_feed(config, config_path.parent, names)
    figures = measure_side_by_side([original, chosen], feed, LatencySpec(warmup=5, repeats=30, threads=1))
    base, mine = figures[0]["latency_ms"], figures[1]["latency_ms"]
    return {"original_ms": round(base, 3), "chosen_ms": round(mine, 3), "ratio": round(mine / base, 3)}


def readable_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    if ratio > 1.0:
        return f"{ratio:.2f}x slower"
    return f"{1.0 / ratio:.2f}x faster"


def _first_in_budget_s(trials: list[dict]) -> float | None:
    """Trial time (sum of ``durations.total_s`` in the order trials were told) up to the first in budget."""
    spent = 0.0
    for trial in sorted(trials, key=lambda t: (t.get("told_index", 0), t.get("number", 0))):
        spent += float((trial.get("durations") or {}).get("total_s") or 0.0)
        if trial.get("meets_criterion"):
            return round(spent, 1)
    return None


def _failures(results: dict, trials: list[dict]) -> dict[str, int]:
    if isinstance(results.get("failure_classes"), dict):
        return dict(results["failure_classes"])
    failed = [t for t in trials if t.get("status") == "failed"]
    return dict(Counter(t.get("failure_class") or "unclassified" for t in failed))


def summarize(run: dict, model_dir: Path) -> dict[str, Any]:
    row: dict[str, Any] = {**run}
    results_path = Path(run["output"]) / "results.json"
    if not results_path.is_file():
        row["verdict"] = f"no results (exit {run['exit_code']})"
        return row
    results = json.loads(results_path.read_text())
    trials = results.get("trials") or []
    metric = results.get("metric")
    baseline = results.get("baseline") or {}
    best = results.get("best")
    row.update(
        trials=len(trials),
        failed=_failures(results, trials),
        first_in_budget_s=_first_in_budget_s(trials),
        verdict=results.get("verdict", "-"),
        verdict_reason=results.get("verdict_reason"),
        metric=metric,
        fp32_metric=baseline.get(metric),
        peak_rss_mb=max((t["peak_rss_mb"] for t in trials if t.get("peak_rss_mb") is not None), default=None),
        stage_peak_rss_mb=results.get("stage_peak_rss_mb"),
        stop_reason=results.get("stop_reason"),
    )
    if best:
        metrics = best.get("metrics") or {}
        row.update(
            chosen_trial=best.get("number"),
            chosen_metric=metrics.get(metric),
            quantized_compute_fraction=metrics.get("quantized_compute_fraction"),
            quantized_ops=metrics.get("quantized_ops"),
            chosen_params=best.get("params"),
        )
        path = Path(best.get("model_path") or "").expanduser()
        if path.is_file():
            try:
                row["retime"] = retime(Path(run["config"]), path)
            except Exception as exc:  # the table still shows the rest
                row["retime_error"] = f"{type(exc).__name__}: {exc}"
    return row


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def markdown(rows: list[dict], args: Any) -> str:
    lines = [
        f"# quantune zoo ({len(rows)} models; max_trials {args.max_trials or 'per config'}, "
        f"timeout {args.timeout or 'per config'} s)",
        "",
        "| model | trials | failed by class | first in budget (s of trials) | verdict | chosen metric vs fp32 "
        "| re-timed vs fp32 | quantized compute | peak RSS MB | traceback |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        if "build_error" in row:
            lines.append(f"| {row['model']} | build failed: {row['build_error']} |" + " - |" * 8)
            continue
        failed = ", ".join(f"{k}: {v}{' (!)' if v > 3 else ''}" for k, v in (row.get("failed") or {}).items()) or "0"
        versus = "-"
        if row.get("metric"):
            versus = f"{_fmt(row.get('chosen_metric'))} vs {_fmt(row.get('fp32_metric'))} ({row['metric']})"
        timing = row.get("retime") or {}
        retimed = readable_ratio(timing.get("ratio"))
        if timing:
            retimed += f" ({timing['chosen_ms']:.3g} vs {timing['original_ms']:.3g} ms)"
        elif row.get("retime_error"):
            retimed = f"re-time failed: {row['retime_error'][:80]}"
        fraction = row.get("quantized_compute_fraction")
        verdict = str(row.get("verdict", "-"))
        if verdict == "improved" and (timing.get("ratio") or 0.0) > 1.0:
            verdict += " (!) but slower re-timed"
        lines.append(
            f"| {row['model']} | {_fmt(row.get('trials'))} | {failed} | {_fmt(row.get('first_in_budget_s'))} "
            f"| {verdict} | {versus} | {retimed} "
            f"| {'-' if fraction is None else f'{fraction:.0%}'} | {_fmt(row.get('peak_rss_mb'))} "
            f"| {'YES' if row.get('traceback') else 'no'} |"
        )
    lines += [
        "",
        "(!) marks a bar missed: a failure class counted more than 3 times, or an `improved` verdict whose",
        "model re-times slower than the original. Re-timing: the chosen model and the original, interleaved,",
        "30 rounds after 5 warm-up runs, 1 thread, on the first evaluation feed (for a runner model: one call).",
        "",
        "Stop reasons and verdict reasons:",
        "",
    ]
    for row in rows:
        if "build_error" not in row:
            lines.append(f"- {row['model']}: {row.get('stop_reason') or '-'}; {row.get('verdict_reason') or '-'}")
    return "\n".join(lines) + "\n"
