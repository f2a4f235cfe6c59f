"""The bench: quantune and its peers on real models, measured one way, in one table.

    python bench/run.py [--cases digits,minilm] [--tools quantune,inc,nncf,olive,quark]
                        [--max-trials 16] [--timeout 300] [--out bench/results]
    python bench/run.py --add-to bench/results/peers-<date>.json --tools quantune   # more rows, re-timed

``--tools`` takes a tool (its rows: ``inc`` is Neural Compressor's default strategy ``basic``,
static and dynamic; ``inc-all`` adds ``mse_v2``; ``nncf_ov`` is NNCF on OpenVINO) or single rows
(``inc-mse_v2-dynamic``). ``--timeout`` is the one time
limit, the same for every row: wall-clock from the start of the tool's process, which is
killed at the limit (a killed row keeps the evaluations it made, read from its progress
file, but has no model). Each tool's own time limit is set ``--margin`` (default 10%) below
it, so a tool that honours its limit has time to save its model.

Every tool runs in its own subprocess (its own venv: see ``bench/setup.sh``) with the same
case file, budget and limits, and writes its result model plus timings as JSON. The harness
then re-measures every result model the same way (``common.latency_interleaved``: each model on
its own runtime, onnxruntime CPU unless the tool made an OpenVINO IR, 1 thread, fixed batch,
warm-up then median, every model of a case in the same interleaved rounds; ``bench/timing.py``)
and its accuracy on the same evaluation split, and writes ``<out>/<date>.md``, ``<out>/<date>.json`` and ``<out>/<date>.png``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from cases import CACHE, CASES, REPO, Case  # noqa: E402
from common import input_names, meets, relative_loss  # noqa: E402
from peer_table import write_report  # noqa: E402
from timing import RUNTIME_VENVS, measure_models  # noqa: E402

# row name -> (venv folder under CACHE, or None for quantune's own venv; runner script; its arguments)
TOOLS: dict[str, tuple[str | None, str, tuple[str, ...]]] = {
    "quantune": (None, "quantune_tool.py", ()),
    "inc-basic-static": ("venv-inc", "inc_tool.py", ("basic", "static")),
    "inc-basic-dynamic": ("venv-inc", "inc_tool.py", ("basic", "dynamic")),
    "inc-mse_v2-static": ("venv-inc", "inc_tool.py", ("mse_v2", "static")),
    "inc-mse_v2-dynamic": ("venv-inc", "inc_tool.py", ("mse_v2", "dynamic")),
    # NC's default timeout=0: stops at its first model in budget (the rows above tune on until max_trials)
    "inc-basic-early-static": ("venv-inc", "inc_tool.py", ("basic", "static", "early")),
    "inc-basic-early-dynamic": ("venv-inc", "inc_tool.py", ("basic", "dynamic", "early")),
    "nncf": ("venv-nncf", "nncf_tool.py", ()),
    "nncf_ov": ("venv-nncf", "nncf_ov_tool.py", ()),
    "olive-static": ("venv-olive", "olive_tool.py", ("static",)),
    "olive-dynamic": ("venv-olive", "olive_tool.py", ("dynamic",)),
    "quark": ("venv-quark", "quark_tool.py", ()),
}
# a name in --tools that stands for several rows (else a row, or every row starting with "name-")
GROUPS = {
    "inc": ("inc-basic-static", "inc-basic-dynamic"),  # Neural Compressor's default strategy (issue 23)
    "inc-all": ("inc-basic-static", "inc-basic-dynamic", "inc-mse_v2-static", "inc-mse_v2-dynamic"),
    "inc-early": ("inc-basic-early-static", "inc-basic-early-dynamic"),
}
# the original on OpenVINO, timed beside a case's OpenVINO rows (what "just run it on OpenVINO" gives)
OPENVINO_FP32 = {"name": "openvino", "config": {"INFERENCE_PRECISION_HINT": "f32"}}


def expand_tools(names: str) -> list[str]:
    """``inc`` -> NC's basic rows, ``inc-all`` every NC row, ``olive`` both Olive rows; a row stays itself."""
    rows: list[str] = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        matched = list(GROUPS.get(name, ())) or [row for row in TOOLS if row == name or row.startswith(f"{name}-")]
        rows += matched or [name]
    return rows


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def tool_python(tool: str) -> Path | None:
    venv = TOOLS[tool][0]
    if venv is None:
        return Path(sys.executable)
    python = CACHE / venv / "bin" / "python"
    return python if python.exists() else None


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    if env.get("PYTHONPATH"):  # the tools run in their own folders: a relative entry would miss
        env["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    env.update(
        ORT_DISABLE_TELEMETRY="1",
        HF_HUB_OFFLINE="1",
        NNCF_DISABLE_TELEMETRY="1",
        CONSENT_TO_TRACKING="0",
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "2"),
        # quantune serialises its timings through a machine-wide lock file; the bench's own keeps
        # quantune's row from waiting on other quantune processes of the machine (peers have none)
        QUANTUNE_LATENCY_LOCK=str(CACHE / "bench-latency.lock"),
    )
    return env


def ensure_built(case: Case) -> None:
    if case.zoo:
        if not case.built:
            log(f"{case.name}: building with {case.build}")
            subprocess.run([sys.executable, *case.build.split()], check=True, env=child_env(), cwd=REPO)
        zoo_run().run_config(case.name, None, None)  # links the zoo scripts beside the data, writes zoo-run.yaml
        return
    if case.built or case.build is None:
        return
    python = CACHE / "venv-build" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"case '{case.name}' needs {case.build}, run `make bench` (or bench/setup.sh build) first")
    log(f"{case.name}: building with {case.build}")
    subprocess.run([str(python), str(REPO / case.build)], check=True, env=child_env())


def zoo_run():
    """bench/zoo/run.py as a module (its run_config links a zoo model's scripts and writes its config)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("zoo_run", BENCH / "zoo" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure_job(spec: dict, job: dict) -> dict[str, dict]:
    """Runs :func:`timing.measure_models` here, or, when a model runs on a runtime this venv lacks
    (OpenVINO), in that runtime's venv (every model of the job then in that one process)."""
    runtimes = {runtime["name"] for _, runtime in job["models"].values() if runtime} - {"onnxruntime"}
    job = {**job, "spec": spec}
    if not runtimes:
        return measure_models(job)
    venv = RUNTIME_VENVS[sorted(runtimes)[0]]
    python = CACHE / venv / "bin" / "python"
    folder = CACHE / "runs" / "timing"
    folder.mkdir(parents=True, exist_ok=True)
    job_file, out_file = folder / f"{spec['name']}-job.json", folder / f"{spec['name']}-out.json"
    job_file.write_text(json.dumps(job))
    subprocess.run([str(python), str(BENCH / "timing.py"), str(job_file), str(out_file)], check=True, env=child_env())
    return json.loads(out_file.read_text())


def measure(case: Case, model: Path, spec: dict, runtime: dict | None = None) -> dict:
    """Accuracy on the evaluation split, latency (the one method) and size of one model file."""
    job = {"models": {"model": [str(model), runtime]}, "accuracy": ["model"]}
    job.update(warmup=max(5, case.latency_repeats // 5), repeats=case.latency_repeats, interleaved=False)
    return measure_job(spec, job)["model"]


def prune_runs(runs: Path, keep: int, log: Callable[[str], None]) -> None:
    """Removes all but the ``keep`` newest run work folders under ``runs`` (the shared ``timing``
    folder stays): each run keeps every tool's models and caches, and 30 GB of them once filled
    this machine's disk until an install in CI failed. The reports in bench/results stay."""
    if not runs.is_dir():
        return
    folders = sorted(
        (p for p in runs.iterdir() if p.is_dir() and p.name != "timing"), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for old in folders[max(0, keep) :]:
        shutil.rmtree(old, ignore_errors=True)
        log(f"removed an earlier run's work folder {old} (--keep-runs {keep})")


def run_tool(tool: str, case_file: Path, out: Path, limit_s: float) -> dict:
    python = tool_python(tool)
    if python is None:
        return {"tool": tool, "status": f"not installed (make bench-peers creates {CACHE / TOOLS[tool][0]})"}
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    _, script_name, extra = TOOLS[tool]
    script = BENCH / "tools" / script_name
    env = child_env()
    env["BENCH_PROGRESS"] = str(out / "progress.jsonl")
    started = time.perf_counter()
    env["BENCH_T0"] = repr(time.time())  # every row's clock starts at its process start
    with open(out / "log.txt", "w") as log_file:
        proc = subprocess.Popen(
            [str(python), str(script), str(case_file), str(out), *extra],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=out,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    wall = time.perf_counter() - started
    result_file = out / "result.json"
    result = json.loads(result_file.read_text()) if result_file.exists() else {"tool": tool}
    result["process_s"] = wall
    if code is None:
        result.pop("model", None)  # a model written after the limit is not the tool's answer
        result["status"] = f"killed at the {limit_s:.0f} s limit"
        result.update(from_progress(out / "progress.jsonl"))
    elif "status" not in result:
        lines = [line.strip() for line in (out / "log.txt").read_text().splitlines() if line.strip()]
        result["status"] = f"exit {code}, no result: {lines[-1][:300] if lines else 'no output'}"
    return result


def from_progress(path: Path) -> dict:
    """What a killed tool's progress file tells: evaluations made, first model in budget."""
    if not path.exists():
        return {}
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    calls = [e for e in entries if "call" in e]  # a peer's scorer; its first call is its fp32 baseline
    found: dict = {
        "evaluations": max(0, len(calls) - 1) if calls else (entries[-1].get("evaluations", 0) if entries else 0)
    }
    first = next((e for e in entries if e.get("first_feasible")), None)
    if first is not None:
        found["first_feasible_s"] = first["t_s"]
        found["first_feasible_evaluations"] = first.get("evaluations", first.get("call", 1) - 1)
    return found


def case_spec(case: Case, max_trials: int, timeout: float, margin: float) -> dict:
    """The case file every tool reads: data, metric, budget, limits (the tool's own and the harness's)."""
    return {
        "name": case.name,
        "model": str(case.model.resolve()),
        "calibration": str((case.folder / case.calibration_file).resolve()),
        "evaluation": str((case.folder / case.evaluation_file).resolve()),
        "metric": case.metric_spec(),
        "label_key": "label",
        "batch_size": case.batch_size,
        "higher_is_better": True,
        "tolerable_loss": case.tolerable_loss,
        "max_trials": max_trials,
        "timeout_s": timeout * (1.0 - margin),  # the tool's own limit
        "limit_s": timeout,  # the harness's: killed then
        "input_names": input_names(case.model),
        "calibration_samples": case.calibration_samples,
        "quantune_config": str(case.folder / case.config),
        "zero_knowledge": not case.zoo,  # the zoo's configs are zero-knowledge already
    }


def bench_case(case: Case, tools: list[str], args, run_dir: Path) -> dict:
    ensure_built(case)
    spec = case_spec(case, args.max_trials, args.timeout, args.margin)
    log(f"{case.name}: measuring fp32")
    fp32 = measure(case, case.model.resolve(), spec)
    spec["baseline"] = fp32["metric"]
    rows = [{"tool": "fp32", "status": "reference", **fp32, "loss": 0.0, "meets": True}]
    report = {"case": case.name, "description": case.description, "spec": spec, "rows": rows}
    run_rows(case, report, tools, args, run_dir)
    return report


def run_rows(case: Case, report: dict, tools: list[str], args, run_dir: Path) -> None:
    """Runs ``tools`` on the case (replacing their earlier rows), then re-times every row together."""
    spec, rows = report["spec"], report["rows"]
    case_file = run_dir / case.name / "case.json"
    case_file.parent.mkdir(parents=True, exist_ok=True)
    case_file.write_text(json.dumps(spec, indent=2))
    for tool in tools:
        rows[:] = [r for r in rows if r["tool"] != tool]
        log(f"{case.name}: running {tool}")
        result = run_tool(tool, case_file, run_dir / case.name / tool, spec["limit_s"])
        add_row(case, spec, rows, {**result, "tool": tool})
    if any((r.get("runtime") or {}).get("name") == "openvino" for r in rows) and "fp32-openvino" not in {
        r["tool"] for r in rows
    }:
        reference = {"tool": "fp32-openvino", "model": spec["model"], "runtime": OPENVINO_FP32}
        add_row(case, spec, rows, {**reference, "status": "reference: the original on OpenVINO's runtime"})
    remeasure_interleaved(case, report)


def add_row(case: Case, spec: dict, rows: list[dict], row: dict) -> None:
    """Measures the row's model (accuracy, size, a first latency) on its runtime and appends the row."""
    model = Path(row["model"]) if row.get("model") else None
    if model is not None and model.exists():
        try:
            figures = measure(case, model, spec, row.get("runtime"))
        except Exception as exc:  # e.g. a model with custom ops plain onnxruntime cannot load
            row["status"] = f"result model not measurable: {type(exc).__name__}: {str(exc)[:200]}"
        else:
            row.update(figures, loss=relative_loss(spec, figures["metric"]), meets=meets(spec, figures["metric"]))
    log(f"{case.name}: {row['tool']}: {row.get('status')} metric={row.get('metric')} latency={row.get('latency_ms')}")
    rows.append(row)


def remeasure_interleaved(case: Case, report: dict) -> None:
    """Replaces each row's latency by one measured in interleaved rounds with all the others, each
    model on its own runtime (fp32 on onnxruntime's CPU provider), in one process."""
    spec = report["spec"]
    models = {"fp32": [spec["model"], None]}
    for row in report["rows"]:
        if row["tool"] != "fp32" and row.get("latency_ms") is not None and row.get("model"):
            models[row["tool"]] = [row["model"], row.get("runtime")]
    log(f"{case.name}: timing {len(models)} models in interleaved rounds")
    job = {"models": models, "warmup": max(5, case.latency_repeats // 5), "repeats": case.latency_repeats}
    figures = measure_job(spec, {**job, "interleaved": True})
    for row in report["rows"]:
        if row["tool"] in figures:
            row.setdefault("latency_sequential_ms", row.get("latency_ms"))  # re-timing keeps the first figure
            row.update(figures[row["tool"]], latency_method="interleaved")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--tools", default="quantune")
    parser.add_argument("--max-trials", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=300.0, help="each tool's search limit (s)")
    parser.add_argument(
        "--margin", type=float, default=0.1, help="share of --timeout below it that each tool's own limit is set"
    )
    parser.add_argument("--prefix", default="", help="the report's file name prefix, e.g. peers-")
    parser.add_argument(
        "--keep-runs",
        type=int,
        default=5,
        help="work folders of earlier bench runs kept (newest first; each holds every tool's models, GBs)",
    )
    parser.add_argument("--note", help="a line under the report's title (e.g. what the run was for)")
    parser.add_argument("--add-to", type=Path, help="run --tools on an earlier report's cases, re-time, rewrite it")
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    parser.add_argument(
        "--remeasure", type=Path, help="re-time an earlier report's models in interleaved rounds and rewrite it"
    )
    args = parser.parse_args()
    if args.remeasure:
        report = json.loads(args.remeasure.read_text())
        report["note"] = args.note or report.get("note")
        for entry in report["cases"]:
            case = CASES[entry["case"]]
            remeasure_interleaved(case, entry)
        print(write_report(report, args.remeasure.with_suffix(""), log))
        return
    tools = expand_tools(args.tools)
    unknown = [t for t in tools if t not in TOOLS] + [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        raise SystemExit(f"unknown tool or case {unknown}; tools: {list(TOOLS)}, cases: {list(CASES)}")
    if args.add_to:
        report = json.loads(args.add_to.read_text())
        run_dir = CACHE / "runs" / report["date"]
        chosen = {c for c in args.cases.split(",") if c} if args.cases != ",".join(CASES) else None
        for entry in report["cases"]:
            if chosen is not None and entry["case"] not in chosen:
                continue
            case = CASES[entry["case"]]
            ensure_built(case)
            run_rows(case, entry, tools, args, run_dir)
            text = write_report(report, args.add_to.with_suffix(""), log)
        print(text)
        return
    stamp = args.prefix + dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d-%H%M")
    run_dir = CACHE / "runs" / stamp
    prune_runs(CACHE / "runs", args.keep_runs, log)
    report = {
        "date": stamp,
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "load": os.getloadavg()[0]},
        "limits": {"max_trials": args.max_trials, "limit_s": args.timeout, "margin": args.margin},
        "command": "python bench/run.py " + " ".join(sys.argv[1:]),
        "note": args.note,
        "cases": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.cases.split(","):
        report["cases"].append(bench_case(CASES[name], tools, args, run_dir))
        text = write_report(report, args.out / stamp, log)  # after every case, so a long run keeps its rows
    print(text)
    log(f"wrote {args.out / stamp}.md/.json (work files in {run_dir})")


if __name__ == "__main__":
    main()
