"""Timing is sized by time, not by count: a model slow by construction (a runner that sleeps, so
every call takes at least its sleep however fast the machine is) is timed to its time share --
each model warmed once and the fewest rounds -- not to ``warmup + repeats`` calls; a paired timing
cut by its share reports itself undecided. The counts asserted are the calls the runner saw."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import build_mlp, mlp_inputs
from quantune.evaluate import LatencySpec, TimingRequest, time_side_by_side
from quantune.evaluate.rounds import UnsureRatio, ceiling_medians, time_until_decided
from robust_helpers import PYTHON, cli_env, make_project

SLEEP_S = 0.2


class SlowRunner:
    """``runner(session, feeds)``: sleeps ``SLEEP_S`` a call (a candidate model alternately 25% less
    and more: its ratio to the original is never on one side of 1), and counts the calls."""

    def __init__(self, original: Path) -> None:
        self.original = str(original)
        self.calls: dict[str, int] = {}

    def __call__(self, session, feeds):
        path = session._model_path
        count = self.calls[path] = self.calls.get(path, 0) + 1
        time.sleep(SLEEP_S if path == self.original else SLEEP_S * (0.75 if count % 2 else 1.25))
        return [
            dict(zip([o.name for o in session.get_outputs()], session.run(None, feed), strict=True)) for feed in feeds
        ]


def test_a_slow_model_is_timed_to_its_time_share_not_to_its_repeats(tmp_path: Path):
    model = build_mlp(tmp_path / "m.onnx")
    runner = SlowRunner(model)
    spec = LatencySpec(warmup=10, repeats=50, threads=1, seconds=0.5)  # 60 calls by count
    timings = time_side_by_side([model], {"x": mlp_inputs(1, 0)}, spec, runner=runner, min_rounds=3)
    # one warm-up call (it alone outlasts the warm-up share), then the fewest rounds (they outlast the share)
    assert timings.shape == (1, 3)
    assert runner.calls == {str(model): 4}


def test_side_by_side_the_share_grows_with_the_models_timed(tmp_path: Path):
    model, twin = build_mlp(tmp_path / "m.onnx"), build_mlp(tmp_path / "t.onnx", seed=1)
    runner = SlowRunner(model)
    spec = LatencySpec(warmup=10, repeats=50, threads=1, seconds=0.5)  # a 1 s share for two models
    timings = time_side_by_side([model, twin], {"x": mlp_inputs(1, 0)}, spec, runner=runner, min_rounds=5)
    assert timings.shape == (2, 5)  # at least the fewest a paired decision needs, and no more
    assert runner.calls == {str(model): 6, str(twin): 6}


def test_a_paired_timing_cut_by_its_share_is_reported_undecided(tmp_path: Path):
    original, candidate = build_mlp(tmp_path / "m.onnx"), build_mlp(tmp_path / "c.onnx", seed=1)
    runner = SlowRunner(original)
    spec = LatencySpec(warmup=10, repeats=50, threads=1, seconds=0.5)
    timings = time_until_decided(
        TimingRequest(
            (original, candidate),
            {"x": mlp_inputs(1, 0)},
            spec,
            threshold=1.0,
            min_rounds=5,
            max_rounds=20,
            runner=runner,
        )
    )
    assert timings.shape == (2, 5)  # cut at the fewest rounds by the share, not 20
    assert runner.calls[str(candidate)] == 1 + 5  # one warm-up call
    (median,) = ceiling_medians(timings, 1.0)
    assert isinstance(median, UnsureRatio)  # not decided: said so, not a side
    assert np.all(~np.isnan(timings))


SLOW_RUNNER = """
import os, time

def run(session, feeds):
    with open(os.path.join(os.path.dirname(__file__), "calls.txt"), "a") as log:
        log.write(f"{os.getpid()} {len(feeds)}\\n")
    time.sleep(0.2 * len(feeds))
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(None, feed))) for feed in feeds]
"""


def test_check_on_a_slow_model_times_to_its_share_shows_progress_and_estimates_the_run(tmp_path: Path):
    evaluation = {
        "metric": "top1",
        "runner": "slow.py:run",
        "latency": {"warmup": 10, "repeats": 50, "threads": 1, "seconds": 0.5},
    }
    config = make_project(tmp_path / "project", max_trials=8, evaluation=evaluation)
    (config.parent / "slow.py").write_text(SLOW_RUNNER)
    check = subprocess.Popen(
        [PYTHON, "-m", "quantune.cli", "check", str(config)],
        cwd=config.parent,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = check.communicate(timeout=600)
    assert check.returncode == 0, stderr
    calls = [line.split() for line in (config.parent / "calls.txt").read_text().splitlines()]
    timed = [pid for pid, feeds in calls if pid == str(check.pid) if feeds == "1"]  # not the memory probe's
    assert len(timed) == 1 + 3  # one warm-up call, the fewest rounds: not 10 + 50
    original = [line for line in stdout.splitlines() if line.startswith("measuring the original: ")]
    assert original[0] == "measuring the original: started" and original[-1].startswith("measuring the original: done")
    assert any("3/50 rounds" in line for line in original)
    assert "cost: one evaluation of the original takes" in stdout
    assert "a run of 8 trials (stop.max_trials) is estimated at ~" in stdout and "of model work" in stdout


def test_a_trials_timing_is_estimated_within_its_time_share() -> None:
    """The run's estimate of a trial (whether one still fits stop.timeout_s) counts a slow model's
    timing as cut by its time share, not as every repeat: else a model of seconds a run was never
    tried within a limit its trials fit."""
    from quantune.evaluate.latency import own_timing_s

    assert own_timing_s(10, 50, 10.0, 0.001) == pytest.approx(0.06)  # a fast model: every run
    slow = own_timing_s(10, 50, 10.0, 4.0)  # 60 runs of 4 s would be 240 s
    assert slow < 40.0 and slow >= 3 * 4.0  # the share and its fewest rounds
