"""quantune's row: ``quantune.tune`` on the case's own config, cold cache, the case's trial/time limit.

A case marked ``zero_knowledge`` (the bench's own cases, whose example configs were written
knowing the model) runs with the zoo's zero-knowledge search instead: static and dynamic
quantization searched, ``strategy: quantune``, nothing hand-picked.

Usage: python quantune_tool.py CASE.json OUT_DIR   (runs in quantune's venv)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import clock_start, load_case, progress, write_result


def absolute_config(path: Path, case: dict, cache_dir: Path) -> dict:
    """The case's quantune config with every path made absolute and the limits set by the bench."""
    raw = yaml.safe_load(path.read_text())
    base = path.resolve().parent

    def resolve(value: str) -> str:
        if ".py:" in value:
            script, _, func = value.rpartition(":")
            return f"{(base / script).resolve()}:{func}"
        return str((base / value).resolve())

    raw["model"] = resolve(raw["model"])
    for key in ("calibration", "evaluation"):
        if key in raw.get("data", {}):
            raw["data"][key] = resolve(raw["data"][key])
    metric = raw.get("evaluation", {}).get("metric", "")
    if ".py:" in metric:
        raw["evaluation"]["metric"] = resolve(metric)
    if case.get("zero_knowledge"):
        # what a user who knows nothing of the model writes (the zoo's configs): both quantization
        # flows searched, the quantune strategy, no hand-picked calibration method or format
        raw["passes"] = [{"name": "static_quant", "search": True}, {"name": "dynamic_quant", "search": True}]
        raw["flows"] = [["static_quant"], ["dynamic_quant"]]
        raw["search"] = {"strategy": "quantune"}
        raw["stop"] = {**raw.get("stop", {}), "max_trials": case["max_trials"], "timeout_s": case["timeout_s"]}
    raw["cache_dir"] = str(cache_dir)
    return raw


class FirstFeasible:
    """A RunListener that notes when the first *quantized* trial meeting the criterion finished
    (wall clock from the process start, as for every tool) and how many full evaluations the
    run had made by then (trials whose evaluation was computed, not a cache hit or a failure)."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.first_s: float | None = None
        self.first_evaluations: int | None = None
        self.evaluations = 0

    def on_start(self, max_trials, baseline) -> None:
        pass

    def on_trial(self, record, status) -> None:
        evaluated = record.cache.get("evaluation") == "miss"
        self.evaluations += int(evaluated)
        elapsed = time.time() - self.started
        entry = {"evaluations": self.evaluations, "t_s": elapsed, "stage": record.stage}
        quantized = (record.metrics.get("quantized_ops") or 0) > 0
        if record.meets_criterion and quantized and self.first_s is None:
            self.first_s, self.first_evaluations = elapsed, self.evaluations
            entry["first_feasible"] = True
        progress(entry)

    def on_end(self, result) -> None:
        pass


def main() -> None:
    case = load_case(sys.argv[1])
    out = Path(sys.argv[2]).resolve()
    import quantune  # as a user would: tune() starts the workers' fork server before it imports the engine

    config = absolute_config(Path(case["quantune_config"]), case, out / "cache")
    # the engine's stop.timeout_s counts from its own start; the bench's limit from the process
    # start: what the imports took comes off, so the run (and its closing re-timing) ends in time
    config["stop"]["timeout_s"] = max(1.0, case["timeout_s"] - (time.time() - clock_start()))
    started = time.perf_counter()
    listener = FirstFeasible(clock_start())
    result = quantune.tune(config, output=out / "run", restart=True, listeners=[listener])
    total = time.perf_counter() - started
    chosen = result.best or result.closest_miss
    keep = result.verdict == "keep_original" or "no quantized variant was faster" in result.stop_reason
    if result.best_model_path is not None:  # improved: best/
        model, status = str(result.best_model_path), "ok"
    elif keep:  # quantune's answer is the original (no candidate beat it): that is what a user deploys
        model, status = str(case["model"]), "keep the original"
    else:
        model = str(out / "run" / "closest_miss" / "model.onnx") if chosen else None
        status = "no model met the budget"
    write_result(
        out,
        {
            "tool": "quantune",
            "status": status,
            "model": model,
            "first_feasible_s": listener.first_s,
            "first_feasible_evaluations": listener.first_evaluations,
            "total_s": total,
            # candidates' evaluations this run computed (the fp32 baseline, cache hits and failed trials are not)
            "evaluations": result.cache_stats.get("evaluation", {}).get("misses", 0),
            "tool_metric": chosen.metrics.get(result.metric) if chosen else None,
            "settings": chosen.params if chosen else None,
            "notes": f"{result.stop_reason}; verdict {result.verdict}: {result.verdict_reason}",
            # what ended the search and what the run concluded (results.json's stop_reason, verdict)
            "stop": result.stop_reason,
            "verdict": result.verdict,
            "verdict_reason": result.verdict_reason,
            "confirmed": result.latency_confirmation is not None and not result.latency_confirmation_skipped,
        },
    )


if __name__ == "__main__":
    main()
