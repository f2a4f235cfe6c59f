"""One run per output folder: a second run is refused naming the holder; a dead holder's lock is taken over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quantune.errors import QuantuneError
from quantune.store.lock import LOCK_NAME, RunLock
from robust_helpers import kill_session, make_project, quantune, start_run, stored_trials, wait_for

SLOW_LATENCY = {"metric": "top1", "latency": {"warmup": 1, "repeats": 1500, "threads": 1, "confirm_top": 0}}


def test_a_second_run_on_the_same_output_is_refused_with_the_holders_pid(tmp_path: Path):
    config = make_project(tmp_path / "project", max_trials=12, evaluation=SLOW_LATENCY)
    output = tmp_path / "out"
    first = start_run(config, output)
    try:
        wait_for(lambda: stored_trials(output) >= 1, process=first, what="the first run's first trial")
        second = quantune("run", str(config), "--output", str(output), "--quiet", cwd=tmp_path)
        assert second.returncode == 2
        assert "Traceback" not in second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"PID {first.pid}" in lines[0] and "--output" in lines[0]
        _, err = first.communicate(timeout=600)
    finally:
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
