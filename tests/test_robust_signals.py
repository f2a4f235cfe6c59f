"""SIGTERM and SIGINT stop a real ``quantune run`` as Ctrl-C does; no worker outlives the run.

Every test starts the command line in its own session with subprocess.Popen, signals it in
the middle of its search (after two trials are stored), and reads the process table (/proc)
for what it left behind.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from robust_helpers import (
    LaneGate,
    alive,
    counted,
    descendants,
    kill_session,
    make_project,
    quantune,
    start_run,
    stored_trials,
    wait_for,
)

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "project", max_trials=24)


def _ignore_sigint() -> None:  # what a non-interactive shell does to `cmd &`
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _signal_mid_run(config: Path, output: Path, signum: int, **popen) -> tuple[int, str, list[int]]:
    """The run signalled mid-search: two trials stored and a third waiting at its timing for the
    lane the test holds (events, not the run's speed: a fast run could otherwise be over first)."""
    assert quantune("check", str(config), cwd=config.parent).returncode == 0  # the original, cached
    with LaneGate() as gate:
        proc = start_run(config, output, **popen)
        try:
            before = stored_trials(output)
            while stored_trials(output) < before + 2:
                gate.let_one_through(proc)
            gate.wait_for_a_timing(proc)
            children = descendants(proc.pid)
            assert children, "the process executor runs its trials in worker processes"
            os.kill(proc.pid, signum)
        except BaseException:
            kill_session(proc.pid)
            raise
    try:
        _, err = proc.communicate(timeout=600)  # the lane is free again: the timing it waited at ends
        return proc.returncode, err, children
    finally:
        if proc.poll() is None:
            kill_session(proc.pid)


@pytest.mark.parametrize(
    ("signum", "code", "cause"), [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")], ids=["term", "int"]
)
def test_a_signal_stops_the_run_keeps_its_trials_and_leaves_no_process(project: Path, signum, code, cause):
    output = project.parent / "out"
    # SIGINT arrives although the run was started with SIGINT ignored (inherited SIG_IGN)
    returncode, err, children = _signal_mid_run(project, output, signum, preexec_fn=_ignore_sigint)
    assert returncode == code, err
    assert "Traceback" not in err
    results = json.loads((output / "results.json").read_text())
    assert results["stop_reason"].startswith(f"interrupted ({cause})")
    kept = len(results["trials"])
    assert kept >= 2 and kept == stored_trials(output)
    wait_for(lambda: not any(alive(pid) for pid in children), timeout=600, what="the workers to exit")

    resumed = quantune("run", str(project), "--output", str(output), "--quiet", cwd=project.parent)
    assert resumed.returncode == 0, resumed.stderr
    final = json.loads((output / "results.json").read_text())
    assert final["replayed_trials"] == kept
    assert counted(final["trials"]) == 24


def test_workers_and_the_resource_tracker_exit_when_the_run_is_killed(project: Path):
    output = project.parent / "out"
    returncode, _, children = _signal_mid_run(project, output, signal.SIGKILL)
    assert returncode == -signal.SIGKILL
    # the worker notices its parent's death (PR_SET_PDEATHSIG, or its watchdog) and the resource
    # tracker sees its pipe close: nothing of the run stays alive
    wait_for(lambda: not any(alive(pid) for pid in children), timeout=600, what="orphans to exit")
    assert stored_trials(output) >= 2

    resumed = quantune("run", str(project), "--output", str(output), "--quiet", cwd=project.parent)
    assert resumed.returncode == 0, resumed.stderr  # the dead run's lock is taken over
    assert counted(json.loads((output / "results.json").read_text())["trials"]) == 24
