"""Heavy stages in isolated workers: a sensitivity worker that dies is recorded, and the run goes on."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from quantune.config import load_config
from quantune.engine import Engine
from quantune.engine.executors.stage import Isolation, run_stage
from quantune.evaluate._exchange import scratch_root
from quantune.report.console import summary

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"
SCALED = ROOT / "examples" / "scaled_cnn"


def _answer(value: int) -> dict[str, int]:
    return {"value": value, "pid": os.getpid()}


def _kill_self(*_: object) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _allocate_gb(gb: int) -> int:
    block = np.ones(gb * 2**30, dtype=np.uint8)
    return int(block[-1])


def test_a_stage_runs_in_another_process_and_reports_its_peak(tmp_path: Path) -> None:
    isolation = Isolation(log_dir=tmp_path)
    outcome = run_stage("probe", _answer, 7, isolation=isolation)
    assert outcome.ok and outcome.value["value"] == 7 and outcome.value["pid"] != os.getpid()
    assert outcome.peak_rss_mb and isolation.stages.peaks["probe"] == pytest.approx(outcome.peak_rss_mb, abs=0.1)
    assert f"worker pid {outcome.value['pid']}" in (tmp_path / "probe.log").read_text()


def test_a_killed_stage_is_recorded_with_its_cause(tmp_path: Path) -> None:
    isolation = Isolation(log_dir=tmp_path)
    outcome = run_stage("sensitivity", _kill_self, isolation=isolation)
    assert not outcome.ok and "SIGKILL" in outcome.error
    assert isolation.stages.errors == [{"stage": "sensitivity", "error": outcome.error, "log_tail": outcome.log_tail}]


def test_a_stage_over_its_memory_limit_fails_not_the_caller(tmp_path: Path) -> None:
    isolation = Isolation(log_dir=tmp_path, memory_limit_mb=3000)
    outcome = run_stage("sensitivity", _allocate_gb, 16, isolation=isolation)
    assert not outcome.ok and "out of memory (memory limit 3000 MB)" in outcome.error


def _killed_probe(job: object) -> dict:
    """Stands in for run_probe in the sensitivity worker: the worker is killed mid-stage."""
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


def test_a_run_whose_sensitivity_worker_is_killed_ends_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import quantune.engine.measure.sensitivity_probe as sensitivity

    monkeypatch.setattr(sensitivity, "run_probe", _killed_probe)  # what the worker is given to run
    config = {
        "model": str(SCALED / "model.onnx"),
        "data": {"calibration": str(DIGITS / "calib.npz"), "evaluation": str(DIGITS / "eval.npz"), "batch_size": 64},
        "evaluation": {"metric": "top1", "latency": {"warmup": 1, "repeats": 2, "threads": 1}},
        "criterion": {"type": "relative", "tolerable_loss": 0.01},
        "passes": [{"name": "static_quant", "search": True, "params": {"per_channel": False}}],
        # every ceiling kept whatever int8's speed: the run must reach its sensitivity stage (on an
        # AVX2-only EPYC, 2 timing rounds left every ceiling unsure at the margin: all dropped)
        "search": {"sampler": "random", "seed": 0, "strategy": "quantune", "strategy_options": {"drop_slow": False}},
        "stop": {"max_trials": 6},
        "cache_dir": str(tmp_path / "cache"),
        "executor": {"kind": "process", "workers": 1},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = Engine(load_config(path), tmp_path / "out").run()
    counted = [
        r for r in result.trials if "(duplicate of trial" not in r.stage
    ]  # a duplicate model is no trial of the budget
    # six trials, or fewer when the strategy is done first (no parameter left that changes the graph)
    assert len(counted) == 6 or (len(counted) > 1 and result.stop_reason.startswith("search finished"))
    assert all(r.peak_rss_mb for r in result.trials if r.status == "ok")
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    [failure] = saved["stage_errors"]
    assert failure["stage"] == "sensitivity" and "SIGKILL" in failure["error"]
    assert "baseline_evaluation" in saved["stage_peak_rss_mb"]
    # the ceilings' passes ran in workers too: built beside the original's evaluation (engine/measure/prebuild.py,
    # then only timed) or in their own stage
    assert {"ceiling_build", "speed_ceiling"} & set(saved["stage_peak_rss_mb"])
    assert "sensitivity" in (tmp_path / "out" / "quantune.log").read_text()
    text = summary(result)
    assert "peak memory: trials" in text and "stage sensitivity failed: worker crashed" in text


def _killed_baseline(spec: object, beside: bool = False) -> dict:
    """Stands in for the original's evaluation in its stage worker: the worker is killed."""
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


def _baseline_noting_pid(spec: object, beside: bool = False) -> dict:
    from quantune.engine.measure.baseline import evaluate_original

    Path(os.environ["QUANTUNE_TEST_PID_FILE"]).write_text(str(os.getpid()))
    return evaluate_original(spec, beside)


def test_the_original_is_evaluated_in_a_worker_whose_death_ends_the_run_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import quantune.engine.measure.baseline as baseline
    from quantune.errors import QuantuneError

    config = {
        "model": str(DIGITS / "model.onnx"),
        "data": {"calibration": str(DIGITS / "calib.npz"), "evaluation": str(DIGITS / "eval.npz"), "batch_size": 64},
        "evaluation": {"metric": "top1", "latency": {"warmup": 1, "repeats": 2, "threads": 1}},
        "passes": [{"name": "dynamic_quant", "search": True}],
        "search": {"sampler": "random", "seed": 0},
        "stop": {"max_trials": 2},
        "cache_dir": str(tmp_path / "cache"),
        "executor": {"kind": "process", "workers": 1},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    monkeypatch.setattr(baseline, "evaluate_original", _killed_baseline)
    failing = Engine(load_config(path), tmp_path / "out")
    before = set(scratch_root().glob("quantune-workers-*"))
    with pytest.raises(QuantuneError, match=r"worker crashed: .*SIGKILL"):
        failing.run()
    assert not (tmp_path / "out" / "results.json").exists()  # no half-written run: the next one starts afresh
    assert failing.early.executor is None  # the trial workers started beside the original are stopped...
    assert set(scratch_root().glob("quantune-workers-*")) <= before  # ...and their scratch logs gone

    pid_file = tmp_path / "baseline.pid"
    monkeypatch.setattr(baseline, "evaluate_original", _baseline_noting_pid)
    monkeypatch.setenv("QUANTUNE_TEST_PID_FILE", str(pid_file))
    engine = Engine(load_config(path), tmp_path / "out")
    result = engine.run()
    assert int(pid_file.read_text()) != os.getpid()  # evaluated in a worker, not here
    # the trial workers started with the original's evaluation, logging to a scratch folder, then here
    assert engine.early.scratch is not None and not engine.early.scratch.exists()
    assert "--- trial 0 ---" in (tmp_path / "out" / "workers" / "worker-0.log").read_text()
    assert result.cache_stats["baseline"] == {"hits": 0, "misses": 1} and len(result.trials) >= 2
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["stage_peak_rss_mb"]["baseline_evaluation"] > 0 and not saved.get("stage_errors")
