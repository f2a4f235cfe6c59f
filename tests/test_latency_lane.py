"""The machine-wide latency lane is held round by round, not for a whole timing: a timing that
waits for it says so and names the holder's pid, and a long timing lets a waiting one in between
its rounds. Synchronised on the lane's own files (a waiter's marker), never on elapsed time."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from conftest import build_mlp, mlp_inputs
from quantune.evaluate import LatencySpec, time_side_by_side
from quantune.evaluate import latency as latency_module
from quantune.evaluate.latency import LatencyLane


@pytest.fixture
def lane_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "lane.lock"
    monkeypatch.setenv("QUANTUNE_LATENCY_LOCK", str(path))
    return path


def _until(condition, what: str, done: threading.Event | None = None) -> None:
    """Waits for ``condition`` (a synchronisation point; the bound only ends a broken test)."""
    for _ in range(60_000):
        if condition():
            return
        if done is not None and done.is_set():
            break
        threading.Event().wait(0.005)
    raise AssertionError(f"never happened: {what}")


def test_a_timing_that_waits_for_the_lane_says_so_and_names_the_holder(tmp_path, lane_path, capsys):
    model = build_mlp(tmp_path / "m.onnx")
    holder = LatencyLane(lane_path, say=lambda _: None)
    holder.acquire()
    finished = threading.Event()
    result = {}

    def timing() -> None:
        result["timings"] = time_side_by_side([model], {"x": mlp_inputs(1, 0)}, LatencySpec(warmup=1, repeats=3))
        finished.set()

    thread = threading.Thread(target=timing)
    thread.start()
    try:
        _until(lambda: holder.waiters(), "the timing waiting for the lane", finished)
        assert not finished.is_set()
    finally:
        holder.release()
        thread.join()
    assert result["timings"].shape == (1, 3)
    out = capsys.readouterr().out
    assert "waiting for the latency lane" in out and f"pid {os.getpid()}" in out


def test_a_long_timing_lets_a_waiting_one_in_between_its_rounds(tmp_path, lane_path, monkeypatch, capsys):
    monkeypatch.setattr(latency_module, "LANE_SLICE_S", 0.0)  # hand over at the next round
    model = build_mlp(tmp_path / "m.onnx")
    other = LatencyLane(lane_path, say=lambda _: None)
    started, finished = threading.Event(), threading.Event()
    calls = []

    def runner(session, feeds):
        calls.append(1)
        if len(calls) == 3:  # the 2nd round: hold it until the other timing queues for the lane
            started.set()
            _until(lambda: other.waiters(), "the other timing queueing")
        return [dict(zip([o.name for o in session.get_outputs()], session.run(None, f), strict=True)) for f in feeds]

    result = {}

    def timing() -> None:
        spec = LatencySpec(warmup=1, repeats=6)
        result["timings"] = time_side_by_side([model], {"x": mlp_inputs(1, 0)}, spec, runner=runner)
        finished.set()

    thread = threading.Thread(target=timing)
    thread.start()
    try:
        started.wait()
        other.acquire()  # queues; the first timing lets it in after this round
        try:
            assert not finished.is_set() and len(calls) < 7  # in the middle of the first timing
            _until(lambda: other.waiters(), "the first timing waiting to go on")  # it waits for the lane again
        finally:
            other.release()
    finally:
        thread.join()
    assert result["timings"].shape == (1, 6)  # and then finished its rounds
    assert "waiting for the latency lane" in capsys.readouterr().out
