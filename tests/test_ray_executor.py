"""The Ray executor, tested for real against a local Ray started by the test."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import quantune
from faulty_plugin import write_plugin as _plugin
from quantune.engine.executors.ray_cargo import scratch_folder

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    node = ray.get_runtime_context().get_node_id()
    ray.shutdown()
    shutil.rmtree(scratch_folder(node), ignore_errors=True)  # its scratch


def test_ray_executor_runs_trials_on_a_local_ray(tmp_path: Path, make_config, local_ray: Any) -> None:
    config = make_config(
        passes=[
            {"name": "faulty", "params": {"mode": {"search": ["ok", "raise"]}}},
            {"name": "dynamic_quant", "params": {"weight_type": {"search": ["int8", "uint8"]}}},
        ],
        plugins=[_plugin(tmp_path)],
        executor={"kind": "ray", "workers": 2},
    )
    result = quantune.tune(config, output=tmp_path / "out")
    # The second 'raise' point fails in 'faulty' as the first did: it is skipped once that failure is known.
    assert len(result.trials) + result.skipped_known_failures == 4
    statuses = {(t.params["faulty.mode"], t.status) for t in result.trials}
    assert statuses == {("ok", "ok"), ("raise", "failed")}
    assert result.best is not None
    assert ray.is_initialized(), "a Ray the caller started is left running"
    # every model was timed here, where the engine runs: the end re-times side by side as a local run does
    assert result.latency_confirmation is not None
    here = ray.get_runtime_context().get_node_id()[:12]
    assert all(here in t.nodes["timed"] for t in result.trials if t.status == "ok")


def test_ray_trial_timeout_cancels_a_hanging_trial(tmp_path: Path, make_config, local_ray: Any) -> None:
    """Two trials in flight, the Ray node's CPUs for one (``cpus_per_trial: 2``): the "ok" trial waits
    for the hanging one's CPUs, then for a fresh worker (the cancel kills the hanging one's). Its
    limit counts from its start on its worker, not from its submission: the wait was the hanging
    trial's whole limit, and a cold worker's start-up on a busy machine once took all of it too."""
    config = make_config(
        passes=[{"name": "faulty", "params": {"mode": {"search": ["hang", "ok"]}}}],
        plugins=[_plugin(tmp_path)],
        executor={"kind": "ray", "workers": 2, "cpus_per_trial": 2, "trial_timeout_s": 10},
    )
    result = quantune.tune(config, output=tmp_path / "out")
    by_mode = {t.params["faulty.mode"]: t for t in result.trials}
    assert by_mode["hang"].status == "failed" and by_mode["hang"].error.startswith("timeout")
    assert by_mode["ok"].status == "ok", by_mode["ok"].error
    # the "ok" trial copies the model: it meets the criterion but is no candidate
    assert by_mode["ok"].meets_criterion
    assert result.best is None and f"trial(s) {by_mode['ok'].number} met it" in result.verdict_reason


def test_rays_own_warnings_go_to_the_run_log_not_the_console(tmp_path: Path, make_config) -> None:
    import json
    import os
    import subprocess
    import sys

    config = tmp_path / "config.json"
    config.write_text(json.dumps(make_config(executor={"kind": "ray", "workers": 1})))
    # a cluster this machine knows of (RAY_ADDRESS, or one another program started here) is not the
    # run's: without executor.address it starts a Ray of its own (it failed with a traceback, once
    # another session's test cluster was up on the machine)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "RAY_ADDRESS": "127.0.0.1:1"}
    command = [sys.executable, "-m", "quantune", "run", str(config), "--output", str(tmp_path / "out"), "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)  # (a local Ray of its own)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "out" / "quantune.log").read_text()
    assert "ray" in log and "Started a local Ray instance" in log  # Ray's own lines, in the run's log
    assert "Started a local Ray instance" not in done.stderr and "Token authentication" not in done.stderr


def test_ray_trials_are_timed_through_the_target_environment(tmp_path: Path, make_config, local_ray: Any) -> None:
    import sys

    config = make_config(executor={"kind": "ray", "workers": 2}, target={"python": sys.executable})
    result = quantune.tune(config, output=tmp_path / "out")
    assert [t.status for t in result.trials] == ["ok", "ok"]
    assert result.target is not None and result.target["isolated"]  # the engine's timings went through its server
    assert result.latency_confirmation is not None
