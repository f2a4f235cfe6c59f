"""The peers beside the provider axis (``bench/providers.py --axis --peers inc,nncf_ov``).

The provider axis is judged against the best tool for each provider: Neural Compressor on the
CPU provider (``inc``: its default strategy, static and dynamic) and NNCF's accuracy control on
OpenVINO (``nncf_ov``). Each peer runs exactly as ``bench/run.py`` runs it (its own venv, the
same case file, trial budget and time limit), then:

* an ONNX model (Neural Compressor's) joins the axis table's interleaved session in the OpenVINO
  environment, on the CPU provider, its accuracy measured there by quantune's evaluator;
* an OpenVINO IR (NNCF's) cannot open in onnxruntime: it is timed by ``bench/timing.py`` in
  ``venv-nncf``, interleaved with the original on that venv's CPU provider, each on its own
  runtime with one thread, and its accuracy measured there on OpenVINO. Its ratio is its median
  latency over the original's in that session (a second session: ratios compare across the two,
  milliseconds do not).

A peer's model counts when it meets the case's budget (relative loss against the original's
metric measured in the same session, ``common.meets``); a peer without one returns the original (1.0x).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent


def _bench_run() -> Any:
    """bench/run.py, by its path: a zoo case puts bench/zoo (whose run.py is the zoo's) on sys.path."""
    spec = importlib.util.spec_from_file_location("bench_peer_run", BENCH / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _case(name: str) -> Any:
    from cases import CASES, zoo_case

    return CASES[name] if name in CASES else zoo_case(name)


def run_peers(name: str, peers: str, args: Any, work: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Runs the peers on the case: (the case file every peer read, one result per peer row)."""
    run = _bench_run()
    case_spec, expand_tools, measure, run_tool = run.case_spec, run.expand_tools, run.measure, run.run_tool
    case = _case(name)
    if case.zoo:  # the peers read the case's scripts from the zoo cache: link this checkout's there first
        run.zoo_run().run_config(name, None, None)
    spec = case_spec(case, args.max_trials, getattr(args, "peer_timeout", None) or args.timeout, 0.1)
    spec["baseline"] = measure(case, case.model.resolve(), spec)["metric"]
    case_file = work / "peers" / "case.json"
    case_file.parent.mkdir(parents=True, exist_ok=True)
    case_file.write_text(json.dumps(spec, indent=2))
    rows = []
    for tool in expand_tools(peers):
        result = run_tool(tool, case_file, work / "peers" / tool, spec["limit_s"])
        rows.append({**result, "tool": tool})
    return spec, rows


def onnx_peers(rows: list[dict[str, Any]]) -> dict[str, Path]:
    """The peers' ONNX models (timed on the CPU provider in the axis table's session), by label."""
    out = {}
    for row in rows:
        runtime = (row.get("runtime") or {}).get("name", "onnxruntime")
        if runtime == "onnxruntime" and row.get("model") and Path(row["model"]).is_file():
            out[f"{row['tool']} on CPU EP"] = Path(row["model"])
    return out


def ir_peers(spec: dict[str, Any], rows: list[dict[str, Any]], rounds: int) -> dict[str, dict[str, Any]]:
    """The peers' OpenVINO IRs timed in their runtime's venv beside the original on the CPU provider."""
    measure_job = _bench_run().measure_job
    if not spec:  # the peers did not run
        return {}
    models: dict[str, list[Any]] = {"fp32": [spec["model"], None]}
    for row in rows:
        runtime = row.get("runtime") or {}
        if runtime.get("name") == "openvino" and row.get("model") and Path(row["model"]).is_file():
            models[f"{row['tool']} on OpenVINO"] = [row["model"], runtime]
    if len(models) == 1:
        return {}
    job = {"models": models, "accuracy": list(models), "warmup": 2, "repeats": rounds, "interleaved": True}
    try:
        figures = measure_job(spec, job)
    except Exception as exc:  # the venv or the runtime failed: the row says so, the table goes on
        return {label: {"error": " ".join(str(exc).split())[:160]} for label in models if label != "fp32"}
    base = figures["fp32"]
    out = {}
    for label in models:
        if label == "fp32":
            continue
        mine = figures[label]
        out[label] = {
            "metric": mine["metric"],
            "ratio": {
                "ratio_median": mine["latency_ms"] / base["latency_ms"],
                "ratio_ci_low": None,
                "ratio_ci_high": None,
            },
            "latency_ms": mine["latency_ms"],
            "baseline_metric": base["metric"],
            "separate_session": True,
        }
    return out


def in_budget(spec: dict[str, Any], metric: float, baseline: float) -> bool:
    from common import meets

    return meets({**spec, "baseline": baseline}, metric)


def statuses(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Each peer row's status line (why a row has no model)."""
    return {row["tool"]: str(row.get("status", "")) for row in rows}
