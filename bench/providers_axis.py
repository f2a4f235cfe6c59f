"""The provider axis's table (bench/providers.py --axis): where each model should run.

Per case, all timed in one interleaved session in the OpenVINO environment, each model on its
own provider, as paired ratios to the original on the CPU provider (90% interval):

* the original on OpenVINO's EP;
* the best int8 model of a quantune run on the CPU provider alone (``target`` as before), on the CPU EP;
* that int8 model on OpenVINO's EP (or why it does not load there);
* quantune with ``target.providers: auto``: its answer on the provider it names.

Accuracy (the case's metric) is measured on the same provider as the timing.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import quantune
from quantune.config import load_config
from quantune.engine.setup import build_run
from quantune.evaluate import paired_ratio
from quantune.evaluate.session_file import read_session_settings, write_session_settings

CPU, OPENVINO = "CPUExecutionProvider", "OpenVINOExecutionProvider"


def _on(model: Path, folder: Path, provider: str, threads: int) -> Path:
    """A copy of ``model`` that runs on ``provider`` (its settings beside it)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / model.name
    shutil.copyfile(model, path)
    settings = dict(read_session_settings(model) or {})
    if provider != CPU:
        settings |= {"provider": provider, "provider_options": {"num_of_threads": str(threads)}}
    else:
        settings.pop("provider", None), settings.pop("provider_options", None)
    if settings:
        write_session_settings(path, settings)
    return path


def axis_case(name: str, base: dict[str, Any], python: Path, work: Path, tune, args) -> dict[str, Any]:
    """Tunes ``base`` on the CPU provider and with ``providers: auto``, then times the table's models."""
    target = {"python": str(python), "provider": CPU}
    cpu = tune({**base, "target": target}, work / "cpu-only", args.max_trials, args.timeout)
    auto = tune({**base, "target": {**target, "providers": "auto"}}, work / "auto", args.max_trials, args.timeout)
    threads = int(base.get("evaluation", {}).get("latency", {}).get("threads", 1))
    original = Path(base["model"])
    scratch = Path(tempfile.mkdtemp(prefix="quantune-axis-"))
    models: dict[str, Path] = {"original on CPU EP": original}
    models["original on OpenVINO EP"] = _on(original, scratch / "ov-original", OPENVINO, threads)
    int8 = cpu.best if cpu.best is not None and cpu.best.model_path else None
    if int8 is not None:
        models["best int8 on CPU EP"] = Path(int8.model_path)
        models["that int8 on OpenVINO EP"] = _on(Path(int8.model_path), scratch / "ov-int8", OPENVINO, threads)
    if auto.improved and auto.best is not None:
        models["quantune providers: auto"] = Path(str(auto.best.model_path))
    parts = build_run(load_config({**base, "target": target}))
    evaluator = parts.context.evaluator
    metric = evaluator.spec.metric
    figures: dict[str, dict[str, Any]] = {}
    timed: dict[str, Path] = {}
    for label, path in models.items():
        try:
            metrics, _ = evaluator.evaluate(path, None)
        except Exception as exc:  # e.g. a QOperator model OpenVINO does not load
            figures[label] = {"error": " ".join(str(exc).split())[:160]}
            continue
        figures[label] = {"metric": metrics[metric]}
        timed[label] = path
    timings = evaluator.timings_side_by_side(list(timed.values()), warmup=2, repeats=args.rounds)
    for row, label in enumerate(timed):
        figures[label]["ratio"] = paired_ratio(timings[row], timings[0]).to_dict()
        figures[label]["latency_ms"] = float(np.median(timings[row]) * 1000)
    shutil.rmtree(scratch, ignore_errors=True)
    where = (auto.best.session_settings or {}).get("provider", CPU) if auto.improved and auto.best else CPU
    return {
        "case": name,
        "metric": metric,
        "figures": figures,
        "cpu_only": {"verdict": cpu.verdict, "reason": cpu.verdict_reason},
        "auto": {"verdict": auto.verdict, "reason": auto.verdict_reason, "provider": where},
        "target": evaluator.backend.describe(),
    }


def _cell(figure: dict[str, Any] | None) -> str:
    if figure is None:
        return "-"
    if "error" in figure:
        return f"does not load: {figure['error']}"
    ratio = figure["ratio"]
    if ratio["ratio_ci_high"] is None or ratio["ratio_ci_low"] is None:  # too few rounds for an interval
        return f"{ratio['ratio_median']:.2f}x, {figure['metric']:.4f}"
    return f"{ratio['ratio_median']:.2f}x [{ratio['ratio_ci_low']:.2f}-{ratio['ratio_ci_high']:.2f}], {figure['metric']:.4f}"


def axis_markdown(cases: list[dict[str, Any]], command: str) -> str:
    lines = [
        "# Where it runs: the provider axis",
        "",
        f"`{command}`. Every model timed in one interleaved session in the OpenVINO environment, each on "
        "its own provider, 1 thread; cells: median paired ratio to the original on the CPU provider [90% "
        "interval], then the case's metric measured on that provider.",
        "",
        "| case | original on OpenVINO EP | best int8 on CPU EP | that int8 on OpenVINO EP | quantune providers: auto |",
        "| --- | --- | --- | --- | --- |",
    ]
    for case in cases:
        f = case["figures"]
        auto = case["auto"]
        answer = (
            f"{auto['verdict']} on {auto['provider']}: {_cell(f.get('quantune providers: auto'))}"
            if auto["verdict"] == "improved"
            else f"{auto['verdict']}"
        )
        lines.append(
            f"| {case['case']} ({case['metric'].rpartition(':')[2]} {f['original on CPU EP']['metric']:.4f}) "
            f"| {_cell(f.get('original on OpenVINO EP'))} | {_cell(f.get('best int8 on CPU EP'))} "
            f"| {_cell(f.get('that int8 on OpenVINO EP'))} | {answer} |"
        )
    lines.append("")
    for case in cases:
        lines.append(f"- {case['case']}: CPU-only run: {case['cpu_only']['reason']}; auto: {case['auto']['reason']}")
    return "\n".join(lines)


__all__ = ["axis_case", "axis_markdown", "quantune"]
