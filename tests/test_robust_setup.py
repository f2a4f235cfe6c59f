"""A run that fails during setup leaves nothing behind; budgets that make no sense are said."""

from __future__ import annotations

from pathlib import Path

import yaml

from robust_helpers import make_project, quantune


def _config(tmp_path: Path, **changes) -> Path:
    config = make_project(tmp_path / "project", max_trials=2, executor={"kind": "inline"})
    data = yaml.safe_load(config.read_text())
    data.update(changes)
    config.write_text(yaml.safe_dump(data))
    return config


def test_a_relative_criterion_on_a_metric_whose_baseline_is_0_is_an_error_and_leaves_nothing(tmp_path: Path):
    config = _config(tmp_path, evaluation={"metric": "l2", "latency": {"repeats": 2, "confirm_top": 0}})
    output = tmp_path / "out"
    done = quantune("run", str(config), "--output", str(output), "--quiet", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "criterion.type" in lines[0] and "type: absolute" in lines[0]
    assert not output.exists()  # it failed after claiming the folder (the baseline is measured first)

    existing = tmp_path / "existing"
    existing.mkdir()
    again = quantune("run", str(config), "--output", str(existing), "--quiet", cwd=tmp_path)
    assert again.returncode == 2
    assert list(existing.iterdir()) == []  # a folder the user made stays, emptied of what the run wrote

    data = yaml.safe_load(config.read_text())
    data["criterion"] = {"type": "absolute", "tolerable_loss": 0.5}
    config.write_text(yaml.safe_dump(data))
    fixed = quantune("run", str(config), "--output", str(existing), "--quiet", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr  # no --restart needed: the failed run left no run behind


def test_a_relative_budget_above_half_is_a_one_line_warning_and_the_run_goes_on(tmp_path: Path):
    config = _config(tmp_path, criterion={"type": "relative", "tolerable_loss": 5})
    done = quantune("run", str(config), "--output", str(tmp_path / "out"), "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("quantune: warning:")]
    assert len(warnings) == 1 and "criterion.tolerable_loss" in warnings[0] and "500%" in warnings[0]
    assert (tmp_path / "out" / "results.json").is_file()


def test_a_sane_budget_says_nothing(tmp_path: Path):
    # 5% of top-1 over the project's 32 evaluation rows: more than one row (a finer budget is warned)
    config = _config(tmp_path, criterion={"type": "relative", "tolerable_loss": 0.05})
    done = quantune("run", str(config), "--output", str(tmp_path / "out"), "--quiet", cwd=tmp_path)
    assert done.returncode == 0 and "warning" not in done.stderr
