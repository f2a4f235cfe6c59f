"""A user script may import modules beside it, and what it imports is part of the run's identity."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

import quantune
from quantune.cli import main
from quantune.userlocal import local_imports, script_fingerprint

METRIC = """
import numpy as np
from helper import SCALE


def score(outputs, data):
    logits = next(iter(outputs.values()))
    return float(np.mean(np.argmax(logits, axis=1) == data["label"])) * SCALE
"""
HELPER = "from consts import FACTOR\nSCALE = FACTOR * {scale}\n"  # a module imported by the helper: transitive


def project(tmp_path: Path, make_config, *, scale: str, **overrides) -> Path:
    (tmp_path / "metric.py").write_text(METRIC)
    (tmp_path / "helper.py").write_text(HELPER.format(scale=scale))
    (tmp_path / "consts.py").write_text("FACTOR = 1.0\n")
    config = make_config(
        [{"name": "dynamic_quant", "params": {"weight_type": {"search": ["int8", "uint8"]}}}],
        evaluation={"metric": "metric.py:score", "latency": {"repeats": 3}},
        **overrides,
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_local_imports_follow_the_scripts_folder_transitively(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from .inner import VALUE\n")
    (tmp_path / "pkg" / "inner.py").write_text("VALUE = 1\n")
    (tmp_path / "helper.py").write_text("import pkg\n")
    script = tmp_path / "metric.py"
    script.write_text("import os, numpy\n\ndef score(o, d):\n    import helper\n    return 1.0\n")
    assert set(local_imports(script)) == {"helper", "pkg", "pkg.inner"}, "stdlib and installed packages are not local"

    before = script_fingerprint(script)
    (tmp_path / "pkg" / "inner.py").write_text("VALUE = 2\n")
    assert script_fingerprint(script) != before, "a module two imports away is part of the fingerprint"

    alone = tmp_path / "alone.py"
    alone.write_text("import numpy\n")
    assert script_fingerprint(alone) == hashlib.sha256(alone.read_bytes()).hexdigest(), "older runs still resume"


def test_a_metric_imports_its_helper_and_an_edited_helper_is_a_changed_metric(make_config, tmp_path, capsys):
    config = project(tmp_path, make_config, scale="1.0")
    out = tmp_path / "out"
    first = quantune.tune(str(config), output=out)
    assert first.baseline["metric.py:score"] == pytest.approx(1.0)

    (tmp_path / "consts.py").write_text("FACTOR = 0.25  # edited\n")  # two imports away from metric.py
    assert main(["run", str(config), "--output", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "evaluation.metric (metric.py) changed since this run started" in err, err

    fresh = quantune.tune(str(config), output=tmp_path / "fresh")  # another folder, the same cache
    assert fresh.baseline["metric.py:score"] == pytest.approx(0.25), "the edited helper is the one that runs"
    assert all(t.cache["evaluation"] == "miss" for t in fresh.trials), "no figure of the old helper is reused"


def test_worker_processes_import_the_helper_too(make_config, tmp_path):
    config = project(tmp_path, make_config, scale="0.5", executor={"kind": "process", "workers": 1})
    result = quantune.tune(str(config), output=tmp_path / "out")
    assert result.baseline["metric.py:score"] == pytest.approx(0.5)
    assert result.trials and all(t.status == "ok" for t in result.trials), [t.error for t in result.trials]
    assert all(t.metrics["metric.py:score"] <= 0.5 for t in result.trials)


def test_two_scripts_with_helpers_of_one_name_each_get_their_own(tmp_path):
    from quantune.userimport import load_function

    for name, value in (("a", 1), ("b", 2)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "helper.py").write_text(f"VALUE = {value}\n")
        (folder / "metric.py").write_text("from helper import VALUE\n\n\ndef score(outputs, data):\n    return VALUE\n")
    first = load_function("a/metric.py:score", "evaluation.metric", tmp_path)
    second = load_function("b/metric.py:score", "evaluation.metric", tmp_path)
    assert (first({}, {}), second({}, {})) == (1, 2)
    (tmp_path / "a" / "helper.py").write_text("VALUE = 10  # edited\n")
    assert load_function("a/metric.py:score", "evaluation.metric", tmp_path)({}, {}) == 10


RUNNER = """
from runhelper import run_all


def run(session, feeds):
    return run_all(session, feeds)
"""
RUNHELPER = """
def run_all(session, feeds):
    names = [out.name for out in session.get_outputs()]
    return [dict(zip(names, session.run(names, feed))) for feed in feeds]
"""


def test_a_runner_evaluated_in_a_target_interpreter_imports_its_helper_there(make_config, tmp_path):
    import sys

    (tmp_path / "drive.py").write_text(RUNNER)
    (tmp_path / "runhelper.py").write_text(RUNHELPER)
    evaluation = {"metric": "top1", "runner": f"{tmp_path / 'drive.py'}:run", "latency": {"repeats": 2}}
    target = {"python": sys.executable, "provider": "CPUExecutionProvider"}
    result = quantune.tune(make_config(evaluation=evaluation, target=target), output=tmp_path / "out")
    assert result.baseline["top1"] == pytest.approx(1.0)
    assert result.trials and all(t.status == "ok" for t in result.trials), [t.error for t in result.trials]
