"""``executor.runtime_env`` on a multi-node cluster simulated on this machine (test_ray_cluster.py's:
a head that runs nothing, two worker nodes that never see the engine's disk): a metric that reaches
files by path runs on the nodes from their copy of the working_dir, and without it, its trials fail
saying where to name those files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import quantune
from test_ray_runtime_env import _project

ray = pytest.importorskip("ray")
import test_ray_cluster  # noqa: E402
from test_ray_cluster import _config, _notes  # noqa: E402

cluster = test_ray_cluster.cluster  # its simulated cluster (a module's fixture: one per module)


def _run_config(tmp_path: Path, kind: str, runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    config = _config(tmp_path, kind)
    project = tmp_path / "project" if (tmp_path / "project").exists() else _project(tmp_path)
    config["evaluation"]["metric"] = f"{project / 'case' / 'metric.py'}:score"
    # the spy plugin inside the folder too: its class is imported from the node's copy
    (project / "spy.py").write_bytes((tmp_path / "spy.py").read_bytes())
    config["plugins"] = [str(project / "spy.py")]
    if runtime_env is not None:
        config["executor"]["runtime_env"] = runtime_env
    return config


def test_a_metric_that_reaches_files_by_path_runs_on_the_nodes_from_the_working_dir(
    tmp_path: Path, cluster: Any
) -> None:
    project = _project(tmp_path)
    env = {"working_dir": str(project), "excludes": ["*.pyc"]}
    on_ray = quantune.tune(_run_config(tmp_path, "ray", env), output=tmp_path / "out-ray")
    local = quantune.tune(_run_config(tmp_path, "process", None), output=tmp_path / "out-local")

    workers = {node.node_id[:12] for node in cluster[1]}
    ok = [t for t in on_ray.trials if t.status == "ok"]
    assert len(ok) == len(on_ray.trials) == 2
    assert all(any(node in t.nodes["built"] for node in workers) for t in ok)  # built on the worker nodes
    notes = _notes(tmp_path / "ray-notes.jsonl")  # the spy's, from each pass it ran on a node
    assert notes and all(note["node"][:12] in workers for note in notes)
    # its file was the node's copy of the working_dir (Ray's), neither the engine's nor the cargo's scripts/
    assert all(note["plugin"].endswith("/spy.py") and not note["plugin"].startswith(str(tmp_path)) for note in notes)
    assert all("/scripts/" not in note["plugin"] for note in notes)
    # the metric gives what it gives here, on the nodes' copies of its folder
    metric = on_ray.metric
    assert sorted(t.metrics[metric] for t in on_ray.trials) == pytest.approx(
        sorted(t.metrics[metric] for t in local.trials)
    )
    assert on_ray.verdict == local.verdict and on_ray.best.model_sha256 == local.best.model_sha256


def test_without_the_runtime_env_the_nodes_trials_fail_saying_to_name_it(tmp_path: Path, cluster: Any) -> None:
    result = quantune.tune(_run_config(tmp_path, "ray", None), output=tmp_path / "out")
    assert result.trials and all(t.status == "failed" for t in result.trials)
    for trial in result.trials:
        assert "No module named 'wd_shared'" in trial.error
        assert "name the files it reaches by path in executor.runtime_env" in trial.error


def test_a_ray_that_quantune_starts_gives_its_tasks_the_runtime_env_too(tmp_path: Path) -> None:
    """(A run of its own: this process holds the test cluster.) Its one node is this machine, but its
    workers still run the cargo's copies of the scripts: the metric's files come through the working_dir."""
    import json
    import os
    import subprocess
    import sys

    project = _project(tmp_path)
    config = _run_config(tmp_path, "ray", {"working_dir": str(project)})
    (tmp_path / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "RAY_ADDRESS": "127.0.0.1:1"}  # (not a cluster's)
    command = [
        sys.executable,
        "-m",
        "quantune",
        "run",
        str(tmp_path / "config.json"),
        "--output",
        str(tmp_path / "out"),
    ]
    done = subprocess.run([*command, "--quiet"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    trials = json.loads((tmp_path / "out" / "results.json").read_text())["trials"]
    assert len(trials) == 2 and all(trial["status"] == "ok" for trial in trials), [t.get("error") for t in trials]
