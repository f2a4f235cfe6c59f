"""End to end on the bundled digits example (a real CNN and real data), with a few trials."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml

import quantune
from conftest import run_model
from quantune import Criterion
from quantune.cli import main
from quantune.model import file_sha256
from test_space import brute_force

DIGITS = Path(__file__).resolve().parents[1] / "examples" / "digits"
TOP_LEVEL = {
    "baseline",
    "trials",
    "best",
    "closest_miss",
    "metric",
    "criterion",
    "objective",
    "stop_reason",
    "duration_s",
    "cache",
}
TRIAL_KEYS = {
    "number",
    "flow",
    "params",
    "status",
    "metrics",
    "meets_criterion",
    "accuracy_loss",
    "objective",
    "durations",
    "cache",
    "error",
    "model_path",
}


def top1_of(model: Path, batch_size: int) -> float:
    with np.load(DIGITS / "eval.npz") as archive:
        images, labels = archive["input"], archive["label"]
    predictions = []
    for start in range(0, len(images), batch_size):
        logits = run_model(model, {"input": images[start : start + batch_size]})[0]
        predictions.append(np.argmax(logits, axis=-1))
    return float(np.mean(np.concatenate(predictions) == labels))


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("digits")
    config = yaml.safe_load((DIGITS / "config.yaml").read_text())
    config["stop"]["max_trials"] = 3
    config["evaluation"]["latency"] = {"warmup": 1, "repeats": 3, "threads": 1}
    config["cache_dir"] = str(tmp / "cache")
    # Relative paths in a dict config resolve against the working directory: make them absolute.
    config["model"] = str(DIGITS / config["model"])
    for key in ("calibration", "evaluation"):
        config["data"][key] = str(DIGITS / config["data"][key])
    model_sha = file_sha256(DIGITS / "model.onnx")
    out = tmp / "out"
    result = quantune.tune(config, output=out)
    return {
        "config": config,
        "result": result,
        "out": out,
        "results": json.loads((out / "results.json").read_text()),
        "model_sha": model_sha,
    }


def test_results_json_layout(digits_run):
    results = digits_run["results"]
    assert set(results) >= TOP_LEVEL
    assert len(results["trials"]) == 3
    assert [t["number"] for t in results["trials"]] == [0, 1, 2]
    for trial in results["trials"]:
        assert set(trial) >= TRIAL_KEYS
        assert trial["flow"] == ["static_quant"]
        assert all(name.startswith("static_quant.") for name in trial["params"])
        assert trial["status"] == "ok", trial["error"]
        assert trial["objective"] == trial["metrics"]["latency_ms"]
    assert results["metric"] == "top1"
    assert results["objective"] == "latency"
    assert results["criterion"]["type"] == "relative"
    assert results["criterion"]["tolerable_loss"] == 0.01
    assert results["criterion"]["higher_is_better"] is True
    assert "max_trials" in results["stop_reason"]
    for name in ("top1", "latency_ms", "size_bytes"):
        assert name in results["baseline"]
    assert (digits_run["out"] / "config.json").is_file()
    assert (digits_run["out"] / "run.db").is_file()


def test_baseline_is_the_original_model_measured(digits_run):
    baseline = digits_run["results"]["baseline"]
    assert baseline["top1"] == pytest.approx(top1_of(DIGITS / "model.onnx", 64))
    assert baseline["size_bytes"] == (DIGITS / "model.onnx").stat().st_size
    assert baseline["top1_agreement"] == 1.0
    assert baseline["latency_ms"] > 0


def test_meets_criterion_agrees_with_the_criterion_math(digits_run):
    results = digits_run["results"]
    criterion = Criterion("relative", 0.01, higher_is_better=True)
    baseline_top1 = results["baseline"]["top1"]
    for trial in results["trials"]:
        check = criterion.check(baseline_top1, trial["metrics"]["top1"])
        assert trial["meets_criterion"] is check.meets
        assert trial["accuracy_loss"] == pytest.approx((baseline_top1 - trial["metrics"]["top1"]) / baseline_top1)


def test_best_is_the_fastest_trial_meeting_the_criterion(digits_run):
    results = digits_run["results"]
    feasible = [t for t in results["trials"] if t["meets_criterion"]]
    assert feasible, "no static-quant trial met 1% relative loss on digits"
    # Two contenders (by search-time figures, engine/measure/confirm.py) were timed again beside the original ...
    confirmation = results["latency_confirmation"]
    confirmed = [t for t in feasible if t["number"] in confirmation["trials"]]
    assert 1 <= len({t["model_path"] for t in confirmed}) <= 2
    assert "latency_search_ms" in results["baseline"]
    # ... and the best is the fastest on those side-by-side figures, or a model the re-timing could
    # not tell from it (the tie rule: the same run twice picks the same model)
    fastest = min(confirmed, key=lambda t: (t["metrics"]["latency_ms"], t["number"]))
    best = next(t for t in confirmed if t["number"] == results["best"]["number"])
    assert best is fastest or {best["number"], fastest["number"]} <= set(confirmation["ties"])
    assert results["best"]["params"] == best["params"]
    assert results["closest_miss"] is None
    assert digits_run["result"].best_model_path == digits_run["out"] / "best" / "model.onnx"


def test_best_model_loads_and_reproduces_its_top1(digits_run):
    results = digits_run["results"]
    best_model = digits_run["out"] / "best" / "model.onnx"
    onnx.checker.check_model(str(best_model))
    assert top1_of(best_model, digits_run["config"]["data"]["batch_size"]) == pytest.approx(
        results["best"]["metrics"]["top1"], abs=1e-12
    )
    # It really is a quantized model, and it is the model the best trial produced.
    assert "QuantizeLinear" in {node.op_type for node in onnx.load(str(best_model)).graph.node}
    assert file_sha256(best_model) == file_sha256(results["best"]["model_path"])
    params = json.loads((digits_run["out"] / "best" / "params.json").read_text())
    assert params["params"] == results["best"]["params"]
    assert params["metrics"] == results["best"]["metrics"]


def test_input_model_is_unchanged(digits_run):
    assert file_sha256(DIGITS / "model.onnx") == digits_run["model_sha"]


def test_space_command_prints_the_brute_force_size(capsys):
    static_space = quantune.get_pass("static_quant").search_space
    _, expected = brute_force(static_space)
    assert main(["space", str(DIGITS / "config.yaml")]) == 0
    out = capsys.readouterr().out
    sizes = [int(n) for line in out.splitlines() if "size" in line.lower() for n in re.findall(r"\b\d+\b", line)]
    assert sizes, out
    assert expected in sizes
