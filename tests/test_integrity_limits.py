"""A metric that never returns ends within a limit that exists by default, with one line."""

from __future__ import annotations

import json

import pytest
import yaml

import quantune
from quantune.engine.trials import limits
from quantune.engine.trials.limits import TrialLimit
from robust_helpers import metric_for_candidates
from robust_helpers import quantune as quantune_cli

# hangs for every model but the first it sees (the original)
HANGS_ON_CANDIDATES = metric_for_candidates("time.sleep(10**6)")
HANGS_ALWAYS = "import time\n\n\ndef score(outputs, data):\n    time.sleep(10**6)\n"


def test_the_default_trial_limit_follows_the_original_and_the_run_limit():
    assert TrialLimit(None, lambda: 0.01).seconds() == limits.TRIAL_FLOOR_S
    slow = 10 * limits.TRIAL_FLOOR_S / limits.PER_ORIGINAL
    assert TrialLimit(None, lambda: slow).seconds() == pytest.approx(limits.PER_ORIGINAL * slow)
    assert TrialLimit(None, lambda: 0.01, cap_s=30.0).seconds() == 30.0, "no trial outlasts stop.timeout_s"
    assert TrialLimit(None).seconds() == limits.ORIGINAL_LIMIT_S, "unknown original: still a limit"
    assert TrialLimit(7.0, lambda: 100.0, cap_s=3.0).seconds() == 7.0, "executor.trial_timeout_s as given"
    assert "executor.trial_timeout_s" in TrialLimit(None).note()


def test_a_metric_hanging_on_candidates_fails_each_by_the_default_limit(make_config, tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "TRIAL_FLOOR_S", 3.0)  # the default's floor, small enough for a test
    (tmp_path / "metric.py").write_text(HANGS_ON_CANDIDATES)
    metric = f"{tmp_path / 'metric.py'}:score"
    config = make_config(
        [{"name": "dynamic_quant", "params": {"weight_type": {"search": ["int8", "uint8"]}}}],
        evaluation={"metric": metric, "latency": {"repeats": 2}},
        stop={"max_trials": 2},
        executor={"kind": "process", "workers": 1},
    )
    result = quantune.tune(config, output=tmp_path / "out")
    assert result.trials and all(t.status == "failed" for t in result.trials)
    for trial in result.trials:
        assert trial.error.startswith("timeout: the trial ran longer than") and "default limit" in trial.error
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["verdict"] == "no_candidate_in_budget"


@pytest.mark.parametrize("command", ["check", "run"])
def test_an_original_whose_metric_never_returns_ends_with_one_line(make_config, tmp_path, command):
    (tmp_path / "metric.py").write_text(HANGS_ALWAYS)
    config = make_config(
        evaluation={"metric": "metric.py:score", "latency": {"repeats": 2}},
        stop={"max_trials": 2, "timeout_s": 5},
        executor={"kind": "process", "workers": 1},
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    args = [command, str(path)] + (["--output", str(tmp_path / "out"), "--quiet"] if command == "run" else [])
    done = quantune_cli(*args, cwd=tmp_path, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "stopped after 5 s (stop.timeout_s)" in lines[0], done.stderr
    if command == "check":  # the step it stopped in: a slow model's timing is not a metric that hangs
        assert "while measuring the original" in lines[0] and "the metric return" in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_a_loader_that_never_returns_ends_the_run_with_one_line(make_config, tmp_path, cnn_data):
    (tmp_path / "loader.py").write_text("import time\n\n\ndef load():\n    time.sleep(10**6)\n")
    data = {"calibration": str(cnn_data["calibration"]), "evaluation": "loader.py:load", "batch_size": 16}
    config = make_config(data=data, stop={"max_trials": 2, "timeout_s": 5})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    done = quantune_cli("run", str(path), "--output", str(tmp_path / "out"), "--quiet", cwd=tmp_path, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "data.evaluation: 'loader.py:load' did not return within 5 s" in lines[0], lines
    assert not (tmp_path / "out").exists()
