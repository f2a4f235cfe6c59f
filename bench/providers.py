"""Tuned for one execution provider, deployed on another: the CPU provider against OpenVINO's.

    python bench/providers.py [--cases digits,ppocr_cls] [--max-trials 12] [--timeout 150]
                              [--rounds 30] [--openvino PYTHON] [--out bench/results] [--axis]

``--axis``: the provider axis's table instead (``bench/providers_axis.py``): the original on
OpenVINO's EP, the best int8 model of a CPU-only run on the CPU EP and on OpenVINO's, and
quantune with ``target.providers: auto``, all as paired ratios to the original on the CPU EP.

For each case quantune runs twice from the same config: evaluated here on the CPU execution
provider, and evaluated in a second virtual environment with ``onnxruntime-openvino`` on
``OpenVINOExecutionProvider`` (``target: {python, provider}``; the environment is the tests'
own, ``tests/target_env.py``, created when missing). Then the original and both runs' best
candidates are measured on *both* providers: accuracy, peak session memory, and latency timed
side by side, interleaved round by round with the original, as a median paired ratio with its
90% interval (``evaluate/paired.py``). The table (``providers-<date>.md`` + ``.json``) says
whether the model tuned for one provider is also the one to ship on the other.

Cases: ``digits`` (examples/digits) and any zoo model already built in the zoo cache
(``bench/zoo``, ``~/.cache/quantune-zoo``), ``zoo`` for all of them (the three detectors
included); the zoo's committed config is used with its paths made absolute, so nothing in the
shared zoo cache is written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

import quantune  # noqa: E402
from quantune.config import load_config  # noqa: E402
from quantune.engine.trials.setup import build_run  # noqa: E402
from quantune.evaluate import paired_ratio  # noqa: E402
from target_env import openvino_python  # noqa: E402

ZOO_CACHE = Path.home() / ".cache" / "quantune-zoo"
OPENVINO = "OpenVINOExecutionProvider"


def log(message: str) -> None:
    print(f"[providers {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _absolute(value: str, base: Path) -> str:
    path, sep, function = value.rpartition(":") if ".py:" in value else (value, "", "")
    return f"{(base / path).resolve()}{sep}{function}"


def case_config(name: str) -> dict[str, Any]:
    """The case's config with every file it names absolute."""
    if name == "digits":
        source, base = REPO / "examples" / "digits" / "config.yaml", REPO / "examples" / "digits"
    else:
        source, base = REPO / "bench" / "zoo" / name / "config.yaml", ZOO_CACHE / name
        if not (base / ".built").is_file():
            raise SystemExit(f"{name}: not built; run python bench/zoo/run.py --build-only --models {name}")
    config = yaml.safe_load(source.read_text())
    scripts = source.parent  # a zoo case's data.py / metric.py live in the repo, beside their config
    # and read the cache's files from there (models, data, a metric's own files: ratings, a charset):
    if name != "digits":  # linked as the zoo links them (ignored by git)
        files = [p for p in base.iterdir() if p.is_file() and not p.name.startswith(".")]
        for file in sorted(p.name for p in files if p.suffix not in (".py", ".yaml")):
            if not (scripts / file).exists():
                (scripts / file).symlink_to(base / file)
    config["model"] = _absolute(config["model"], base)
    for key in ("calibration", "evaluation"):
        if config["data"].get(key):
            value = config["data"][key]
            config["data"][key] = _absolute(value, scripts if ".py:" in value else base)
    evaluation = config.setdefault("evaluation", {})
    for key in ("metric", "runner"):
        if ".py:" in str(evaluation.get(key, "")):
            evaluation[key] = _absolute(evaluation[key], scripts)
    return config


def zoo_names() -> list[str]:
    """Every zoo model (a folder of bench/zoo with a config.yaml: the detectors too), by name."""
    return sorted(p.parent.name for p in (REPO / "bench" / "zoo").glob("*/config.yaml"))


def case_names(cases: str) -> list[str]:
    """``--cases``: names, comma-separated; ``zoo`` stands for every zoo model (``zoo_names``)."""
    names: list[str] = []
    for name in cases.split(","):
        for case in zoo_names() if name == "zoo" else [name]:
            if case not in names:
                names.append(case)
    return names


def tune(config: dict[str, Any], output: Path, max_trials: int, timeout: float) -> quantune.Result:
    config = {**config, "stop": {**config.get("stop", {}), "max_trials": max_trials, "timeout_s": timeout}}
    return quantune.tune(config, output, restart=True)


def measure(config: dict[str, Any], models: dict[str, Path], rounds: int) -> dict[str, dict[str, Any]]:
    """Every model on the config's target: its metric, peak memory, and latency interleaved with the original's."""
    parts = build_run(load_config(config))
    evaluator = parts.context.evaluator
    metric = evaluator.spec.metric
    figures: dict[str, dict[str, Any]] = {}
    for label, path in models.items():
        metrics, _ = evaluator.evaluate(path, None)
        figures[label] = {"metric": metrics[metric], "peak_memory_mb": metrics["peak_memory_mb"]}
    timings = evaluator.timings_side_by_side(list(models.values()), warmup=2, repeats=rounds)
    for row, label in enumerate(models):
        ratio = paired_ratio(timings[row], timings[0])
        figures[label].update(
            latency_ms=float(np.median(timings[row]) * 1000),
            ratio=ratio.to_dict(),
        )
    figures["_target"] = evaluator.backend.describe()
    return figures


def _ratio_words(ratio: dict[str, Any]) -> str:
    median, high, low = ratio["ratio_median"], ratio["ratio_ci_high"], ratio["ratio_ci_low"]
    if abs(median - 1) < 1e-12 and high is not None and abs(high - 1) < 1e-12:
        return "1 (itself)"
    interval = f"{low:.2f}-{high:.2f}" if high is not None and low is not None else "no interval"
    return f"{median:.2f} [{interval}]"


def _params(record: Any) -> str:
    if record is None:
        return "-"
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in record.params.items())


def run_case(name: str, args: argparse.Namespace, python: Path, out: Path) -> dict[str, Any]:
    base = case_config(name)
    work = out / "providers-runs" / name
    target = {"python": str(python), "provider": OPENVINO}
    log(f"{name}: tuning for the CPU provider")
    cpu = tune(base, work / "cpu", args.max_trials, args.timeout)
    log(f"{name}: tuning for {OPENVINO} (target {python})")
    ov = tune({**base, "target": target}, work / "openvino", args.max_trials, args.timeout)
    models = {"original": Path(base["model"])}
    for label, result in (("best for CPU", cpu), ("best for OpenVINO", ov)):
        if result.best is not None and result.best.model_path:
            models[label] = Path(result.best.model_path)
    log(f"{name}: measuring {list(models)} on both providers, {args.rounds} interleaved rounds each")
    on_cpu = measure(base, models, args.rounds)
    on_ov = measure({**base, "target": target}, models, args.rounds)
    runs = {"best for CPU": cpu, "best for OpenVINO": ov}
    rows = []
    for label in models:
        record = runs[label].best if label in runs else None
        rows.append(
            {
                "case": name,
                "model": label,
                "trial": None if record is None else record.number,
                "verdict": None if label not in runs else runs[label].verdict,
                "params": _params(record),
                "cpu": on_cpu[label],
                "openvino": on_ov[label],
            }
        )
    return {"case": name, "rows": rows, "targets": {"cpu": on_cpu["_target"], "openvino": on_ov["_target"]}}


def markdown(cases: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "# Tuned for one execution provider, timed on both",
        "",
        f"`python bench/providers.py --cases {args.cases} --max-trials {args.max_trials} --timeout {args.timeout:g} "
        f"--rounds {args.rounds}` ({dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC). Latency: median ms and "
        "the median paired ratio to the original on the same provider [90% interval], timed side by side, "
        "interleaved; a ratio below 1 is faster. Memory: peak MB a fresh session adds loading the model and "
        "running the latency feed. Taken on a 2-core machine shared with other jobs: ratios hold, absolute "
        "milliseconds drift.",
        "",
    ]
    for case in cases:
        cpu_t, ov_t = case["targets"]["cpu"], case["targets"]["openvino"]
        lines += [
            f"## {case['case']}",
            "",
            f"CPU: onnxruntime {cpu_t['onnxruntime']} CPUExecutionProvider; OpenVINO: onnxruntime "
            f"{ov_t['onnxruntime']} (onnxruntime-openvino) {ov_t['provider']}; CPU {cpu_t['cpu']}.",
            "",
            "| model | trial | params | metric CPU | metric OV | CPU EP ms | ratio CPU | OV EP ms | ratio OV "
            "| mem CPU MB | mem OV MB |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for row in case["rows"]:
            c, o = row["cpu"], row["openvino"]
            lines.append(
                f"| {row['model']} | {'-' if row['trial'] is None else row['trial']} | {row['params']} "
                f"| {c['metric']:.4f} | {o['metric']:.4f} | {c['latency_ms']:.3f} | {_ratio_words(c['ratio'])} "
                f"| {o['latency_ms']:.3f} | {_ratio_words(o['ratio'])} | {c['peak_memory_mb']:.1f} "
                f"| {o['peak_memory_mb']:.1f} |"
            )
        verdicts = ", ".join(f"{r['model']}: {r['verdict']}" for r in case["rows"] if r["verdict"])
        lines += ["", f"Verdicts of the two runs: {verdicts}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="digits,ppocr_cls", help="comma-separated; zoo: every zoo model")
    parser.add_argument("--max-trials", type=int, default=12)
    parser.add_argument("--timeout", type=float, default=150.0)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--openvino", help="the OpenVINO environment's python (default: tests/target_env.py's)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--axis", action="store_true", help="the provider axis's table (target.providers: auto)")
    parser.add_argument("--peers", default="", help="with --axis: peer rows as bench/run.py names them (inc,nncf_ov)")
    parser.add_argument("--peer-timeout", type=float, help="each peer row's time limit (default: --timeout)")
    args = parser.parse_args(argv)
    python = Path(args.openvino) if args.openvino else None
    if python is None:
        python, why = openvino_python()
        if python is None:
            print(f"providers: {why}", file=sys.stderr)
            return 1
    args.out.mkdir(parents=True, exist_ok=True)
    if args.axis:
        return axis_main(args, python)
    cases = [run_case(name, args, python, Path("/tmp/quantune-providers")) for name in case_names(args.cases)]
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d-%H%M")
    text = markdown(cases, args)
    (args.out / f"providers-{stamp}.md").write_text(text + "\n")
    (args.out / f"providers-{stamp}.json").write_text(json.dumps(cases, indent=2, default=str) + "\n")
    print(text)
    return 0


def axis_main(args: argparse.Namespace, python: Path) -> int:
    from providers_axis import axis_case, axis_markdown

    work = Path("/tmp/quantune-providers-axis")
    cases = []
    command = (
        f"python bench/providers.py --axis --cases {args.cases} --max-trials {args.max_trials} "
        f"--timeout {args.timeout:g} --rounds {args.rounds}"
        + (f" --peers {args.peers}" if args.peers else "")
        + (f" --peer-timeout {args.peer_timeout:g}" if args.peer_timeout else "")
    )
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d-%H%M")
    for name in case_names(args.cases):
        log(f"{name}: CPU-only run, providers: auto run, then the table's models side by side")
        try:
            cases.append(axis_case(name, case_config(name), python, work / name, tune, args))
        except Exception as exc:  # one case that cannot run does not lose the others' table
            log(f"{name}: failed: {type(exc).__name__}: {exc}")
            continue
        text = axis_markdown(cases, command + f" ({stamp} UTC)")  # written after every case
        (args.out / f"providers-axis-{stamp}.md").write_text(text + "\n")
        (args.out / f"providers-axis-{stamp}.json").write_text(json.dumps(cases, indent=2, default=str) + "\n")
    print(axis_markdown(cases, command + f" ({stamp} UTC)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
