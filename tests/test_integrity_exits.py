"""User code that ends the process (sys.exit, os._exit, a segfault) is named, never a silent exit 0."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from robust_helpers import quantune

LOADER = """
import ctypes
import os
import sys

import numpy as np


def load():
    {body}
    return {{"input": np.zeros((4, 1, 8, 8), np.float32)}}
"""
METRIC = """
import os


def score(outputs, data):
    os._exit(3)
"""


def write(tmp_path: Path, make_config, **overrides) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(make_config(stop={"max_trials": 2}, **overrides)))
    return config


@pytest.mark.parametrize("body", ["sys.exit(0)", "os._exit(0)"])
def test_a_loader_ending_the_process_is_one_line_naming_it(make_config, tmp_path, cnn_data, body):
    (tmp_path / "loader.py").write_text(LOADER.format(body=body))
    data = {"calibration": str(cnn_data["calibration"]), "evaluation": "loader.py:load", "batch_size": 16}
    config = write(tmp_path, make_config, data=data)
    for command in (["check", str(config)], ["run", str(config), "--output", str(tmp_path / "out"), "--quiet"]):
        done = quantune(*command, cwd=tmp_path)
        assert done.returncode == 2, (command, done.returncode, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "data.evaluation" in lines[0] and "loader.py" in lines[0], done.stderr
        assert body in lines[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_metric_ending_its_worker_is_named_not_taken_for_an_unguarded_script(make_config, tmp_path):
    (tmp_path / "metric.py").write_text(METRIC)
    evaluation = {"metric": "metric.py:score", "latency": {"repeats": 2}}
    config = write(tmp_path, make_config, evaluation=evaluation, executor={"kind": "process", "workers": 1})
    done = quantune("run", str(config), "--output", str(tmp_path / "out"), "--quiet", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "evaluation.metric" in last and "metric.py" in last and "os._exit(3)" in last, done.stderr
    assert "__main__" not in done.stderr


def test_a_segfaulting_loader_names_its_file(make_config, tmp_path, cnn_data):
    (tmp_path / "loader.py").write_text(LOADER.format(body="ctypes.string_at(0)"))
    data = {"calibration": str(cnn_data["calibration"]), "evaluation": "loader.py:load", "batch_size": 16}
    config = write(tmp_path, make_config, data=data)
    for command in (["check", str(config)], ["run", str(config), "--output", str(tmp_path / "out"), "--quiet"]):
        done = quantune(*command, cwd=tmp_path)
        assert done.returncode != 0
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr  # from the witness process (userfault.py), not a dump
        assert "data.evaluation: 'loader.py' crashed Python at line 10 in load(): Segmentation fault" in lines[0]


def test_a_metric_crashing_its_worker_names_the_file_and_line(make_config, tmp_path):
    (tmp_path / "metric.py").write_text("import ctypes\n\n\ndef score(outputs, data):\n    ctypes.string_at(0)\n")
    evaluation = {"metric": "metric.py:score", "latency": {"repeats": 2}}
    config = write(tmp_path, make_config, evaluation=evaluation, executor={"kind": "process", "workers": 1})
    done = quantune("run", str(config), "--output", str(tmp_path / "out"), "--quiet", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "segmentation fault" in lines[0], done.stderr
    assert f"in {tmp_path / 'metric.py'}, line 5 (score)" in lines[0]


def test_a_metric_crashing_quantune_check_is_one_line(make_config, tmp_path):
    (tmp_path / "metric.py").write_text("import ctypes\n\n\ndef score(outputs, data):\n    ctypes.string_at(0)\n")
    config = write(tmp_path, make_config, evaluation={"metric": "metric.py:score", "latency": {"repeats": 2}})
    done = quantune("check", str(config), cwd=tmp_path)  # check evaluates the original in its own process
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "evaluation.metric: 'metric.py' crashed Python at line 5 in score()" in lines[0]
