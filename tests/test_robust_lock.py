"""One run per output folder: a second run is refused naming the holder; a dead holder's lock is taken over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quantune.errors import QuantuneError
from quantune.evaluate.latency import LatencyLane
from quantune.store.lock import LOCK_NAME, RunLock
from robust_helpers import (
    PRIVATE_LATENCY_LOCK,
    kill_session,
    make_project,
    quantune,
    start_run,
    stored_trials,
    wait_for,
)


def test_a_second_run_on_the_same_output_is_refused_with_the_holders_pid(tmp_path: Path):
    # The first run is held in the middle of its search by the test, not by being slow: its original
    # is evaluated (and cached) by ``check`` first, then the test holds the runs' latency lane, so the
    # first run claims its output folder and waits for the lane at its first timing -- however fast
    # or loaded the machine is -- until the second run has been refused.
    config = make_project(tmp_path / "project", max_trials=12)
    assert quantune("check", str(config), cwd=tmp_path).returncode == 0
    output = tmp_path / "out"
    lane = LatencyLane(Path(PRIVATE_LATENCY_LOCK), say=lambda _: None)
    lane.acquire()
    first = start_run(config, output)
    try:

        def held_and_waiting() -> bool:
            lock = output / LOCK_NAME
            return lock.is_file() and lock.read_text().strip() == str(first.pid) and bool(lane.waiters())

        wait_for(held_and_waiting, process=first, what="the first run to claim its output and wait for the lane")
        second = quantune("run", str(config), "--output", str(output), "--quiet", cwd=tmp_path)
        assert second.returncode == 2
        assert "Traceback" not in second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"PID {first.pid}" in lines[0] and "--output" in lines[0]
        lane.release()
        _, err = first.communicate(timeout=600)
    finally:
        lane.release()
        if first.poll() is None:
            kill_session(first.pid)
    assert first.returncode == 0, err  # the refused run changed nothing of the first one's
    results = json.loads((output / "results.json").read_text())
    assert len(results["trials"]) == 12 == stored_trials(output)


def test_the_lock_of_a_dead_process_is_taken_over(tmp_path: Path):
    # a process that took the lock and died without a word (as under SIGKILL)
    code = "import sys, time; from pathlib import Path; from quantune.store.lock import RunLock; RunLock.acquire(Path(sys.argv[1])); print('held', flush=True); time.sleep(600)"
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(QuantuneError, match=f"PID {holder.pid}"):
            RunLock.acquire(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(holder.pid)  # the stale file stays...
    lock = RunLock.acquire(tmp_path)  # ...and is taken over
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(os.getpid())
    lock.release()
    RunLock.acquire(tmp_path).release()  # released means free again
