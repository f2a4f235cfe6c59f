"""Target environments, for real: a second virtual environment with onnxruntime-openvino
evaluates the digits CNN and its candidates through the isolated evaluation server.

No mocks: the OpenVINO environment is created by ``target_env.py`` (skipped, saying why, when
PyPI cannot be reached); a target that dies or hangs is a real interpreter killed by a signal
or stuck in a loop, driven by an evaluation runner that runs inside the target.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import quantune
from quantune.cli import main

DIGITS = Path(__file__).resolve().parents[1] / "examples" / "digits"
# 450 evaluation images: two providers may round a borderline logit differently on a few
TOP1_TOLERANCE = 3 / 450


def digits_config(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """Two static_quant points (QDQ and QOperator, MinMax, uint8) on the real digits CNN, fast settings."""
    config: dict[str, Any] = {
        "model": str(DIGITS / "model.onnx"),
        "data": {"calibration": str(DIGITS / "calib.npz"), "evaluation": str(DIGITS / "eval.npz"), "batch_size": 64},
        "evaluation": {"metric": "top1", "latency": {"warmup": 1, "repeats": 3, "threads": 1, "confirm_top": 0}},
        "criterion": {"type": "relative", "tolerable_loss": 0.02},
        "passes": [
            {
                "name": "static_quant",
                "params": {
                    "quant_format": {"search": ["QDQ", "QOperator"]},
                    "calibrate_method": "MinMax",
                    "activation_type": "uint8",
                    "per_channel": False,
                },
            }
        ],
        "search": {"sampler": "exhaustive", "seed": 0},
        "stop": {"max_trials": 2},
        "cache_dir": str(tmp_path / "cache"),
        "executor": {"kind": "inline"},
    }
    config.update(overrides)
    return config


def test_openvino_target_scores_like_the_cpu_provider(tmp_path: Path, ov_python: Path) -> None:
    config = digits_config(tmp_path)  # OpenVINO's EP takes QDQ models only (static_quant's provider rules)
    config["passes"][0]["params"].update(quant_format="QDQ", activation_type={"search": ["uint8", "int8"]})
    cpu = quantune.tune(config, tmp_path / "cpu")
    target = {"python": str(ov_python), "provider": "OpenVINOExecutionProvider"}
    ov = quantune.tune({**config, "target": target}, tmp_path / "ov")

    recorded = json.loads((tmp_path / "ov" / "results.json").read_text())["target"]
    version = subprocess.run(
        [str(ov_python), "-c", "import onnxruntime; print(onnxruntime.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    assert recorded["provider"] == "OpenVINOExecutionProvider" and recorded["isolated"] is True
    assert recorded["onnxruntime"] == version and "OpenVINOExecutionProvider" in recorded["providers_available"]
    assert recorded["python"] and recorded["cpu"]
    assert cpu.target is not None and cpu.target["provider"] == "CPUExecutionProvider" and not cpu.target["isolated"]

    assert abs(ov.baseline["top1"] - cpu.baseline["top1"]) <= TOP1_TOLERANCE
    assert [t.params for t in ov.trials] == [t.params for t in cpu.trials]
    for on_ov, on_cpu in zip(ov.trials, cpu.trials, strict=True):
        assert on_ov.status == on_cpu.status == "ok", (on_ov.error, on_cpu.error)
        assert abs(on_ov.metrics["top1"] - on_cpu.metrics["top1"]) <= TOP1_TOLERANCE
        assert on_ov.metrics["peak_memory_mb"] > 0 and on_ov.metrics["latency_ms"] > 0
    # the same cache: the passes are reused, but no figure of the CPU provider stands in for OpenVINO's
    assert ov.cache_stats["static_quant"] == {"hits": 2, "misses": 0}
    assert ov.cache_stats["evaluation"] == {"hits": 0, "misses": 2}
    assert ov.cache_stats["baseline"]["misses"] == 1


RUNNER = """
import os, signal, time

def run(session, feeds):
    with open(session._model_path, "rb") as handle:
        qoperator = b"QLinearConv" in handle.read()
    if qoperator and {mode!r} == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if qoperator and {mode!r} == "hang":
        while True:
            time.sleep(1)
    names = [out.name for out in session.get_outputs()]
    return [dict(zip(names, session.run(names, feed))) for feed in feeds]
"""


@pytest.mark.parametrize(("mode", "cause"), [("kill", "target crashed"), ("hang", "target timeout")])
def test_a_dead_or_hung_target_fails_the_trial_and_the_run_goes_on(
    tmp_path: Path, ov_python: Path, mode: str, cause: str
) -> None:
    (tmp_path / "drive.py").write_text(RUNNER.format(mode=mode))
    config = digits_config(
        tmp_path, target={"python": str(ov_python), "provider": "CPUExecutionProvider", "timeout_s": 20}
    )
    config["evaluation"]["runner"] = str(tmp_path / "drive.py") + ":run"
    result = quantune.tune(config, tmp_path / "out")

    by_format = {t.params["static_quant.quant_format"]: t for t in result.trials}
    failed, ok = by_format["QOperator"], by_format["QDQ"]
    assert failed.status == "failed" and cause in (failed.error or "")
    assert failed.failure_class is not None and failed.failure_class.startswith(f"evaluation: {cause}")
    assert ok.status == "ok" and ok.metrics["top1"] > 0.9  # the target was started afresh for it
    assert result.stop_reason.startswith("max_trials")


def _cli(config: dict[str, Any], tmp_path: Path, capsys) -> tuple[int, str]:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    code = main(["run", str(path), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, lines
    return code, lines[0]


def test_bad_targets_are_one_line_naming_the_field(tmp_path: Path, capsys) -> None:
    code, line = _cli(digits_config(tmp_path, target={"python": "/nonexistent/bin/python"}), tmp_path, capsys)
    assert code == 2 and "error: target.python:" in line and "/nonexistent/bin/python" in line

    bare = tmp_path / "bare"  # a real interpreter without onnxruntime
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    code, line = _cli(digits_config(tmp_path, target={"python": str(bare / "bin" / "python")}), tmp_path, capsys)
    assert code == 2 and "error: target.python:" in line and "onnxruntime" in line

    code, line = _cli(digits_config(tmp_path, target={"provider": "TensorrtExecutionProvider"}), tmp_path, capsys)
    assert code == 2 and "error: target.provider:" in line and "TensorrtExecutionProvider" in line
    assert not (tmp_path / "out").exists()  # found before the output folder is claimed


def test_a_provider_missing_in_the_target_is_named(tmp_path: Path, ov_python: Path, capsys) -> None:
    target = {"python": str(ov_python), "provider": "CUDAExecutionProvider"}
    code, line = _cli(digits_config(tmp_path, target=target), tmp_path, capsys)
    assert code == 2 and "error: target.provider:" in line and "OpenVINOExecutionProvider" in line


def test_speed_ceilings_are_timed_per_provider(tmp_path: Path, ov_python: Path) -> None:
    """A ceiling timed on the CPU provider is cached; the same model pair on OpenVINO is timed again."""
    from conftest import accuracy_problem

    config = digits_config(tmp_path)
    config["passes"][0]["params"]["quant_format"] = "QDQ"
    evals = tmp_path / "cache" / "evals"

    def entries() -> int:
        return sum(1 for path in evals.rglob("*") if path.is_file()) if evals.is_dir() else 0

    cpu = accuracy_problem(config, timed=True)
    assert cpu.latency_ratio is not None
    first = cpu.latency_ratio({}, ("static_quant",))
    cached = entries()
    assert first is not None and cached >= 1
    assert cpu.latency_ratio({}, ("static_quant",)) == first and entries() == cached  # a cache hit
    target = {"python": str(ov_python), "provider": "OpenVINOExecutionProvider"}
    ov = accuracy_problem({**config, "target": target}, timed=True)
    assert ov.latency_ratio is not None
    assert ov.latency_ratio({}, ("static_quant",)) is not None
    assert entries() == cached + 1  # timed on the target, stored beside the CPU provider's


def test_session_settings_reach_the_target(ov_python: Path) -> None:
    """A candidate's session settings apply on the target as here; a wrong one is refused by both."""
    import numpy as np

    from quantune.errors import TrialError
    from quantune.evaluate import LatencySpec, LocalBackend, TargetBackend, TimingRequest
    from quantune.evaluate.target_client import TargetFault

    model = DIGITS / "model.onnx"
    feed = {"input": np.load(DIGITS / "eval.npz")["input"][:8]}
    spec = LatencySpec(warmup=1, repeats=2, threads=1)
    settings = {"graph_optimization_level": "disable_all", "enable_mem_pattern": False}
    local, target = LocalBackend(), TargetBackend(str(ov_python), "OpenVINOExecutionProvider")
    here = local.outputs(model, [feed], threads=1, runner=None, settings=settings)
    there = target.outputs(model, [feed], threads=1, runner=None, settings=settings)
    assert np.allclose(here[0]["logits"], there[0]["logits"], atol=1e-3)
    for backend in (local, target):
        assert backend.time(TimingRequest((model,), feed, spec, None, settings=settings)).shape == (1, 2)
        assert backend.peak_memory_mb(model, feed, 1, settings=settings) > 0
    with pytest.raises(TrialError, match="unknown session setting"):
        local.outputs(model, [feed], threads=1, runner=None, settings={"no_such_setting": 1})
    with pytest.raises(TargetFault, match="unknown session setting"):
        target.outputs(model, [feed], threads=1, runner=None, settings={"no_such_setting": 1})
