"""The engine at scale: isolated workers, fault injection, kill-and-resume, parallel and Ray runs."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import quantune
from faulty_plugin import write_plugin as _plugin
from robust_helpers import LaneGate, cli_env


def test_faults_become_failed_trials_with_their_cause(tmp_path: Path, make_config) -> None:
    modes = ["ok", "segfault", "oom", "hang", "raise"]
    config = make_config(
        passes=[{"name": "faulty", "params": {"mode": {"search": modes}}}],
        plugins=[_plugin(tmp_path)],
        executor={"kind": "process", "workers": 2, "trial_timeout_s": 20, "memory_limit_mb": 4000},
    )
    result = quantune.tune(config, output=tmp_path / "out")
    by_mode = {record.params["faulty.mode"]: record for record in result.trials}
    assert set(by_mode) == set(modes), "the run must complete every trial despite the faults"
    assert by_mode["ok"].status == "ok" and by_mode["ok"].meets_criterion
    assert "SIGSEGV" in by_mode["segfault"].error
    assert by_mode["segfault"].log_tail, "a crash keeps the tail of the worker's log"
    assert by_mode["oom"].error.startswith("out of memory")
    assert by_mode["hang"].error.startswith("timeout")
    assert "faulty pass raised on purpose" in by_mode["raise"].error
    assert all(by_mode[mode].status == "failed" for mode in modes[1:])
    # the "ok" trial copies the model: it meets the criterion but is no candidate
    assert result.best is None and f"trial(s) {by_mode['ok'].number} met it" in result.verdict_reason


def _trials_in_store(db: Path) -> int:
    try:
        with sqlite3.connect(db) as conn:
            return conn.execute("SELECT count(*) FROM trials").fetchone()[0]
    except sqlite3.Error:
        return 0


def _cache_original(path: Path) -> None:
    """The original's figures in the config's cache (``quantune check``), before the test holds the
    lane: a run's first timing is then its first trial's, after it claimed its output folder."""
    subprocess.run(
        [sys.executable, "-m", "quantune", "check", str(path)], env=cli_env(), check=True, capture_output=True
    )


def _start_run(path: Path, out: Path, gate: LaneGate, *, until_trials: int, **popen: Any) -> subprocess.Popen:
    """Starts ``quantune run`` in a subprocess and returns once ``until_trials`` are in its store and
    the run waits at its next timing for the lane ``gate`` holds: the run is mid-search by events,
    however fast the machine. Its original must be evaluated already (:func:`_cache_original`)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "quantune", "run", str(path), "--output", str(out), "--quiet"], env=cli_env(), **popen
    )
    while _trials_in_store(out / "run.db") < until_trials:
        gate.let_one_through(process)
    gate.wait_for_a_timing(process)
    return process


def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path: Path, make_config) -> None:
    config = make_config(
        passes=[{"name": "static_quant", "search": True}],
        objective="size",  # deterministic, so both runs see the same figures
        search={"sampler": "tpe", "seed": 5},
        stop={"max_trials": 9},
        executor={"kind": "process", "workers": 1},
    )
    reference = quantune.tune(config, output=tmp_path / "uninterrupted")
    # The interrupted run gets a cold cache of its own, so it does the work for real.
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**config, "cache_dir": str(tmp_path / "cold-cache")}))

    out = tmp_path / "killed"
    _cache_original(path)
    with LaneGate() as gate:
        process = _start_run(
            path,
            out,
            gate,
            until_trials=3,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.killpg(process.pid, signal.SIGKILL)  # the engine and its workers, at once
        process.wait()
    finished = _trials_in_store(out / "run.db")
    assert 3 <= finished < 9, "the kill must land mid-run"
    with sqlite3.connect(out / "run.db") as conn:
        before = dict(conn.execute("SELECT number, finished_at FROM trials").fetchall())

    resumed = quantune.tune(str(path), output=out)

    assert resumed.replayed == finished
    with sqlite3.connect(out / "run.db") as conn:
        after = dict(conn.execute("SELECT number, finished_at FROM trials").fetchall())
    assert all(after[number] == stamp for number, stamp in before.items()), "a finished trial was run again"
    assert [t.params for t in resumed.trials] == [t.params for t in reference.trials]
    assert [t.metrics["size_bytes"] for t in resumed.trials] == [t.metrics["size_bytes"] for t in reference.trials]
    assert [t.meets_criterion for t in resumed.trials] == [t.meets_criterion for t in reference.trials]
    # Equal sizes are ranked by measured latency, which differs between runs; the best size may not.
    assert resumed.best.metrics["size_bytes"] == reference.best.metrics["size_bytes"]


def test_changed_config_on_existing_folder_is_refused_unless_restart(tmp_path: Path, make_config) -> None:
    config = make_config(executor={"kind": "inline"})
    quantune.tune(config, output=tmp_path / "out")
    changed = {**config, "criterion": {"type": "relative", "tolerable_loss": 0.2}}
    with pytest.raises(quantune.QuantuneError, match="--restart"):
        quantune.tune(changed, output=tmp_path / "out")
    result = quantune.tune(changed, output=tmp_path / "out", restart=True)
    assert result.trials and result.replayed == 0


def test_parallel_workers_run_every_point_once(tmp_path: Path, make_config) -> None:
    config = make_config(
        passes=[
            {
                "name": "static_quant",
                "params": {
                    "calibrate_method": {"search": ["MinMax", "Percentile"]},
                    "per_channel": {"search": [False, True]},
                },
            }
        ],
        executor={"kind": "process", "workers": 2},
    )
    result = quantune.tune(config, output=tmp_path / "out")
    points = [json.dumps(t.params, sort_keys=True) for t in result.trials]
    assert len(points) == 4 and len(set(points)) == 4
    assert all(t.status == "ok" for t in result.trials), [t.error for t in result.trials]
    assert sorted(t.number for t in result.trials) == [0, 1, 2, 3]
    # Which worker ran what depends on start-up speed; every trial ran in some worker's process.
    logs = "".join(path.read_text() for path in (tmp_path / "out" / "workers").glob("worker-*.log"))
    assert all(f"--- trial {number} ---" in logs for number in range(4))


def test_calibration_is_computed_once_per_setting(tmp_path: Path, make_config) -> None:
    config = make_config(
        passes=[
            {
                "name": "static_quant",
                "params": {"activation_type": {"search": ["uint8", "int8"]}, "per_channel": {"search": [False, True]}},
            }
        ],
        executor={"kind": "inline"},
    )
    quantune.tune(config, output=tmp_path / "out")
    ranges = list((tmp_path / "cache" / "passes" / "static_quant").glob("*.json"))
    assert len(ranges) == 1, "4 trials that differ only in types and per-channel share one calibration"


@pytest.mark.parametrize("kind", ["process", "inline"])
def test_ctrl_c_stops_cleanly_and_the_run_resumes(tmp_path: Path, make_config, kind: str) -> None:
    config = make_config(
        passes=[{"name": "static_quant", "search": True}],
        objective="size",
        search={"sampler": "random", "seed": 1},
        stop={"max_trials": 12},
        executor={"kind": kind, "workers": 1},
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    _cache_original(path)
    with LaneGate() as gate:
        process = _start_run(path, out, gate, until_trials=2, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=600)  # the lane is free again: the timing it waited at ends
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    written = json.loads((out / "results.json").read_text())
    assert written["stop_reason"].startswith("interrupted")
    finished = len(written["trials"])
    assert 2 <= finished < 12
    assert finished == _trials_in_store(out / "run.db")
    resumed = quantune.tune(str(path), output=out)
    spent = [t for t in resumed.trials if "duplicate of trial" not in t.stage]  # a repeated model is no trial
    assert resumed.replayed == finished and len(spent) == 12


def test_a_script_calling_tune_unguarded_gets_advice_not_a_hang(tmp_path: Path, make_config) -> None:
    # Spawned workers import the script that started them; an unguarded tune() there would
    # start a second run inside each worker. The run must stop at once and say what to do.
    config = make_config(executor={"kind": "process", "workers": 1})
    script = tmp_path / "tune_me.py"
    script.write_text(f"import quantune\nquantune.tune({config!r}, output={str(tmp_path / 'out')!r})\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert 'put the call under `if __name__ == "__main__":`' in done.stderr
    assert "tune_me.py" in done.stderr and "Traceback" in done.stderr  # a Python API error, raised

    guarded = tmp_path / "tune_guarded.py"
    guarded.write_text(
        f"import quantune\nif __name__ == '__main__':\n"
        f"    print(len(quantune.tune({config!r}, output={str(tmp_path / 'out2')!r}).trials))\n"
    )
    done = subprocess.run([sys.executable, str(guarded)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "2"
