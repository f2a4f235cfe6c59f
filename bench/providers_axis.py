"""The provider axis's table (bench/providers.py --axis): where each model should run.

Per case, all timed in one interleaved session in the OpenVINO environment, each model on its
own provider, as paired ratios to the original on the CPU provider (90% interval):

* the original on OpenVINO's EP;
* the best int8 model of a quantune run on the CPU provider alone (``target`` as before), on the CPU EP;
* that int8 model on OpenVINO's EP (or why it does not load there);
* quantune with ``target.providers: auto``: its answer on the provider it names;
* with ``--peers``, the peers' models (``bench/providers_peers.py``): Neural Compressor's on the
  CPU provider in the same session, NNCF's OpenVINO IR on OpenVINO's runtime in its own venv.

The summary under the table: the median over cases of the best peer's final ratio over
quantune's (a peer without a model in budget, or with one slower than the original, and quantune's
"keep the original" are 1.0x: the original is every user's fallback), and
the cases where the original on another provider beats every int8 model in budget, with what
quantune returned there (the goal: that original).

Accuracy (the case's metric) is measured on the same provider as the timing.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from providers_peers import in_budget, ir_peers, onnx_peers, run_peers, statuses

import quantune
from quantune.config import load_config
from quantune.engine.trials.setup import build_run
from quantune.evaluate import paired_ratio
from quantune.evaluate.session_file import read_session_settings, write_session_settings

CPU, OPENVINO = "CPUExecutionProvider", "OpenVINOExecutionProvider"
NOISE = 0.02  # a ratio this close to 1 is the original's speed (evaluate/paired.py's MIN_GAIN)


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


def measured_elsewhere(results: dict[str, Any]) -> dict[str, Any]:
    """A run's candidates whose accuracy was measured on a provider other than the one reported for
    them, from its ``results.json``: each evaluated trial's provider as reported (its
    ``provider.provider`` parameter; without the axis, ``target.provider``) against the provider
    its evaluation opened the model on (the session settings the runner read from the file the
    evaluation opened, ``session_settings.provider``, else ``target.provider``; a target refuses a
    session onnxruntime moved to another provider), and the same for the run's ``best``."""
    reference = (results.get("target") or {}).get("provider") or CPU
    elsewhere, counted = [], 0
    rows = [t for t in results.get("trials", []) if t.get("status") == "ok"]
    for trial in rows + ([results["best"]] if results.get("best") else []):
        reported = (trial.get("params") or {}).get("provider.provider") or reference
        measured = (trial.get("session_settings") or {}).get("provider") or reference
        counted += 1
        if reported != measured:
            elsewhere.append({"trial": trial.get("number"), "reported": reported, "measured": measured})
    return {"checked": counted, "elsewhere": len(elsewhere), "which": elsewhere}


def _elsewhere(folder: Path) -> dict[str, Any]:
    path = folder / "results.json"
    try:
        return measured_elsewhere(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        return {"checked": 0, "elsewhere": None, "error": f"{path}: {type(exc).__name__}"}


def axis_case(name: str, base: dict[str, Any], python: Path, work: Path, tune, args) -> dict[str, Any]:
    """Tunes ``base`` on the CPU provider and with ``providers: auto``, then times the table's models."""
    target = {"python": str(python), "provider": CPU}
    cpu = tune({**base, "target": target}, work / "cpu-only", args.max_trials, args.timeout)
    auto = tune({**base, "target": {**target, "providers": "auto"}}, work / "auto", args.max_trials, args.timeout)
    try:
        peer_spec, peer_rows = run_peers(name, args.peers, args, work) if args.peers else ({}, [])
    except Exception as exc:  # peers that cannot score the case (a decoding loop) do not lose quantune's row
        peer_spec, peer_rows = {}, [{"tool": "peers", "status": f"not run: {type(exc).__name__}: {exc}"[:200]}]
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
    models |= onnx_peers(peer_rows)
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
    base_metric = figures["original on CPU EP"]["metric"]
    for label in onnx_peers(peer_rows):
        if "metric" in figures[label]:
            figures[label]["meets"] = in_budget(peer_spec, figures[label]["metric"], base_metric)
    for label, figure in ir_peers(peer_spec, peer_rows, args.rounds).items():
        if "metric" in figure:
            figure["meets"] = in_budget(peer_spec, figure["metric"], figure["baseline_metric"])
        figures[label] = figure
    where = (auto.best.session_settings or {}).get("provider", CPU) if auto.improved and auto.best else CPU
    flow = list(auto.best.flow) if auto.improved and auto.best is not None else []
    return {
        "case": name,
        "metric": metric,
        "figures": figures,
        "cpu_only": {"verdict": cpu.verdict, "reason": cpu.verdict_reason},
        "auto": {"verdict": auto.verdict, "reason": auto.verdict_reason, "provider": where, "flow": flow},
        "measured_elsewhere": {"auto": _elsewhere(work / "auto"), "cpu_only": _elsewhere(work / "cpu-only")},
        "peers": statuses(peer_rows),
        "peer_labels": [label for label in figures if label.startswith(tuple(statuses(peer_rows)))],
        "tolerable_loss": float(base.get("criterion", {}).get("tolerable_loss", 0.01)),
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


def _ratio(figure: dict[str, Any] | None) -> float | None:
    return None if not figure or "ratio" not in figure else float(figure["ratio"]["ratio_median"])


def _meets(case: dict[str, Any], figure: dict[str, Any] | None) -> bool:
    """In budget on the provider it was measured on: the peer's own rule, else the case's relative loss."""
    if not figure or "metric" not in figure:
        return False
    if "meets" in figure:
        return bool(figure["meets"])
    base = case["figures"]["original on CPU EP"]["metric"]
    return (base - figure["metric"]) / abs(base) <= case.get("tolerable_loss", 0.01) + 1e-12


def _elsewhere_cell(case: dict[str, Any]) -> str:
    """``auto: 0 of 9, CPU-only: 0 of 8``: per run, candidates whose accuracy was measured elsewhere."""
    counts = case.get("measured_elsewhere")
    if not counts:
        return "-"
    words = {"auto": "auto", "cpu_only": "CPU-only"}
    return ", ".join(
        f"{words[run]}: {'?' if n.get('elsewhere') is None else n['elsewhere']} of {n['checked']}"
        for run, n in counts.items()
    )


def summary(case: dict[str, Any]) -> dict[str, Any]:
    """quantune's final ratio, the best peer's, and whether an original on another provider beats every int8 model."""
    f = case["figures"]
    final = _ratio(f.get("quantune providers: auto")) if case["auto"]["verdict"] == "improved" else 1.0
    peers = [
        (r, label) for label in case.get("peer_labels", []) if _meets(case, f.get(label)) and (r := _ratio(f[label]))
    ]
    best_peer = min(peers) if peers else (1.0, "the original (no peer model in budget)")
    if best_peer[0] > 1.0:  # the peer's user keeps the original over a slower model, as quantune does
        best_peer = (1.0, f"the original (the peer's model in budget, {best_peer[1]}, is slower: {best_peer[0]:.2f}x)")
    int8 = [*(r for r, _ in peers)]
    for label in ("best int8 on CPU EP", "that int8 on OpenVINO EP"):
        if _meets(case, f.get(label)) and (r := _ratio(f.get(label))) is not None:
            int8.append(r)
    original = _ratio(f.get("original on OpenVINO EP"))
    faster = original is not None and original < 1.0 - NOISE  # than the original where it ran: else keep that
    beats = faster and _meets(case, f.get("original on OpenVINO EP")) and all(original < r for r in int8)
    returned = case["auto"].get("flow") == ["provider"] and case["auto"]["provider"] == OPENVINO
    return {
        "final": final,
        "best_peer": best_peer[0],
        "best_peer_label": best_peer[1],
        "speedup_over_peer": None if not final else best_peer[0] / final,
        "original_elsewhere_beats_int8": beats,
        "returned_it": returned,
    }


def axis_markdown(cases: list[dict[str, Any]], command: str) -> str:
    lines = [
        "# Where it runs: the provider axis",
        "",
        f"`{command}`. Every model timed in one interleaved session in the OpenVINO environment, each on "
        "its own provider, 1 thread; cells: median paired ratio to the original on the CPU provider [90% "
        "interval], then the case's metric measured on that provider. Peers: Neural Compressor's model on the "
        "CPU provider in the same session; NNCF's OpenVINO IR on OpenVINO's runtime in venv-nncf, beside the "
        "original on its CPU provider (a ratio of medians, no interval).",
        "",
        "| case | original on OpenVINO EP | best int8 on CPU EP | that int8 on OpenVINO EP | quantune providers: auto "
        "| best peer in budget | peer final / quantune final | accuracy measured elsewhere |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    speedups = []
    for case in cases:
        f = case["figures"]
        auto = case["auto"]
        facts = summary(case)
        answer = (
            f"{auto['verdict']} on {auto['provider']}: {_cell(f.get('quantune providers: auto'))}"
            if auto["verdict"] == "improved"
            else f"{auto['verdict']}"
        )
        label = facts["best_peer_label"]
        peer = f"{label}: {_cell(f.get(label))}" if label in f else label
        speed = facts["speedup_over_peer"]
        if speed is not None and case.get("peers") and "peers" not in case["peers"]:  # "peers": they did not run
            speedups.append(speed)
        lines.append(
            f"| {case['case']} ({case['metric'].rpartition(':')[2]} {f['original on CPU EP']['metric']:.4f}) "
            f"| {_cell(f.get('original on OpenVINO EP'))} | {_cell(f.get('best int8 on CPU EP'))} "
            f"| {_cell(f.get('that int8 on OpenVINO EP'))} | {answer} | {peer if case.get('peers') else '-'} "
            f"| {'-' if speed is None or not case.get('peers') else f'{speed:.2f}x'} | {_elsewhere_cell(case)} |"
        )
    lines.append("")
    if speedups:
        lines.append(
            f"Median over {len(speedups)} cases of the best peer's final ratio over quantune's: "
            f"**{float(np.median(speedups)):.2f}x** (above 1: quantune's model is faster; goal 1.2x)."
        )
    counts = [c["measured_elsewhere"][run] for c in cases if "measured_elsewhere" in c for run in ("auto", "cpu_only")]
    if counts:
        known = [n for n in counts if n.get("elsewhere") is not None]
        lines.append(
            f"Candidates whose accuracy was measured on a provider other than the one reported for them "
            f"(each run's results.json): **{sum(n['elsewhere'] for n in known)}** of "
            f"{sum(n['checked'] for n in known)} evaluated trials and bests"
            + (
                f" ({len(counts) - len(known)} runs without a readable results.json)"
                if len(known) < len(counts)
                else ""
            )
            + "."
        )
    elsewhere = [(c["case"], summary(c)["returned_it"]) for c in cases if summary(c)["original_elsewhere_beats_int8"]]
    lines.append(
        "Cases where the original on OpenVINO beats every int8 model in budget: "
        + (
            ", ".join(f"{name} (quantune returned {'it' if got else 'another model'})" for name, got in elsewhere)
            or "none"
        )
        + "."
    )
    lines.append("")
    for case in cases:
        peers = "; ".join(f"{tool}: {status}" for tool, status in case.get("peers", {}).items())
        lines.append(
            f"- {case['case']}: CPU-only run: {case['cpu_only']['reason']}; auto: {case['auto']['reason']}"
            + (f"; peers: {peers}" if peers else "")
        )
    return "\n".join(lines)


__all__ = ["axis_case", "axis_markdown", "quantune"]
