"""Timing is sized by time, not by count: a model slow by construction (a runner that sleeps, so
every call takes at least its sleep however fast the machine is, and a round outlasts the time
share whatever the load) is timed to its time share -- each model warmed once and one round, the
fewest rounds cut to what the share holds at the cost of a round -- not to ``warmup + repeats``
calls, nor to five rounds of a paired decision; a paired timing cut by its share reports itself
undecided. The counts asserted are the calls the runner saw."""

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
    spec = LatencySpec(warmup=10, repeats=50, threads=1, seconds=0.1)  # 60 calls by count
    timings = time_side_by_side([model], {"x": mlp_inputs(1, 0)}, spec, runner=runner, min_rounds=3)
    # one warm-up call (it alone outlasts the warm-up share), then one round: it outlasts the share,
    # which holds none of the three fewest rounds asked for (they cost three times the share)
    assert timings.shape == (1, 1)
    assert runner.calls == {str(model): 2}


def test_side_by_side_the_share_grows_with_the_models_timed(tmp_path: Path):
    model, twin = build_mlp(tmp_path / "m.onnx"), build_mlp(tmp_path / "t.onnx", seed=1)
    runner = SlowRunner(model)
    spec = LatencySpec(warmup=10, repeats=50, threads=1, seconds=0.1)  # a 0.2 s share for two models
    timings = time_side_by_side([model, twin], {"x": mlp_inputs(1, 0)}, spec, runner=runner, min_rounds=5)
    assert timings.shape == (2, 1)  # a round (0.4 s) outlasts the share: not the five a decision asks for
    assert runner.calls == {str(model): 2, str(twin): 2}


def test_a_paired_timing_cut_by_its_share_is_reported_undecided(tmp_path: Path):
    original, candidate = build_mlp(tmp_path / "m.onnx"), build_mlp(tmp_path / "c.onnx", seed=1)
    runner = SlowRunner(original)
    spec = LatencySpec(warmup=10, repeats=50, threads=1, seconds=0.1)
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
    assert timings.shape == (2, 1)  # cut by the share at the one round it holds, not 5, nor 20
    assert runner.calls[str(candidate)] == 1 + 1  # one warm-up call
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
        "latency": {"warmup": 10, "repeats": 50, "threads": 1, "seconds": 0.1},
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
    assert len(timed) == 1 + 1  # one warm-up call, one round (it outlasts the share): not 10 + 50
    original = [line for line in stdout.splitlines() if line.startswith("measuring the original: ")]
    assert original[0] == "measuring the original: started" and original[-1].startswith("measuring the original: done")
    assert any("1/50 rounds" in line for line in original)
    assert "cost: one evaluation of the original takes" in stdout
    assert "a run of 8 trials (stop.max_trials) takes ~" in stdout


def test_checks_estimate_counts_calibration_and_the_trials_a_time_limit_holds(make_config) -> None:
    """A heavy model's run is cut by its time limit: check says so and how many trials fit, a trial
    costing its calibration (at the evaluation's cost a row), an evaluation and a timing."""
    from quantune.config import load_config
    from quantune.engine.trials.setup import build_run
    from quantune.report.check_summary import cost_lines

    loaded = load_config(make_config([{"name": "static_quant"}], stop={"max_trials": 8, "timeout_s": 100}))
    lines = cost_lines(loaded.config, build_run(loaded), 12.0, 5.0)  # 64 calibration rows, 48 evaluation rows
    assert lines[0].endswith("a trial ~33 s (calibration, evaluation, timing)")  # 16 + 12 + 5
    assert lines[1].startswith("a run stops at stop.timeout_s = 100 s, time for about 2 trial(s); all 8")


def test_a_trials_timing_is_estimated_within_its_time_share() -> None:
    """The run's estimate of a trial (whether one still fits stop.timeout_s) counts a slow model's
    timing as cut by its time share, not as every repeat: else a model of seconds a run was never
    tried within a limit its trials fit."""
    from quantune.evaluate.latency import timing_cost_s

    assert timing_cost_s(10, 50, 10.0, 0.001) == pytest.approx(0.06)  # a fast model: every run
    slow = timing_cost_s(10, 50, 10.0, 4.0)  # 60 runs of 4 s would be 240 s
    assert slow < 40.0 and slow >= 3 * 4.0  # the share and its fewest rounds


@pytest.mark.parametrize("run_s", [0.001, 0.3, 2.0, 4.9, 12.0, 45.0])
def test_a_timing_costs_about_its_share_or_two_runs_whatever_one_run_costs(run_s: float) -> None:
    """The rule every timing follows, as its cost: at most the share, its warm-up quarter and two
    runs -- a model of seconds a run (check's original, the run's) is timed within about a minute, a
    heavy one in a warm-up call and one round, never its five or 60 runs."""
    from quantune.evaluate.interleave import fewest_within
    from quantune.evaluate.latency import timing_cost_s

    share_s = 10.0
    cost = timing_cost_s(10, 50, share_s, run_s)
    assert cost <= share_s + share_s / 4 + 2 * run_s
    assert cost <= 60.0 or run_s > 5.0
    if run_s > share_s:
        assert cost == pytest.approx(2 * run_s)  # one warm-up call, one round
    assert fewest_within(5, share_s, run_s) == max(1, min(5, int(share_s / run_s)))
    assert fewest_within(5, share_s, 0.0) == 5  # no cost measured: the fewest asked for


def test_the_end_keeps_what_the_retiming_it_will_do_costs() -> None:
    """The time a run keeps back for its closing re-timing counts the warm-up that re-timing runs:
    one pass where a pass outlasts the warm-up share (a heavy model), not two; and the five rounds a
    verdict rests on (the confirmation's own share holds them)."""
    from quantune.engine.measure.confirm import MIN_ROUNDS, retiming_warmup

    assert retiming_warmup(10, 10.0, 3, 0.01) == 2  # a fast model: both passes
    assert retiming_warmup(10, 10.0, 3, 135.0) == 1  # three models of 45 s a run: one pass
    assert retiming_warmup(0, 10.0, 3, 135.0) == 1  # each session runs once before its first round
    assert MIN_ROUNDS == 5


class FakeClock:
    """``time.perf_counter`` for :func:`interleaved`: it moves only when a timed call runs (by that
    call's cost), so how many rounds the rule runs is independent of the machine."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def call(self, cost_s: float):
        def run() -> None:
            self.now += cost_s

        return run


@pytest.mark.parametrize(("cost_s", "rounds"), [(0.5, 20), (4.0, 3), (45.0, 1)])
def test_rounds_stop_when_the_share_is_spent_at_the_measured_cost_of_a_round(
    monkeypatch: pytest.MonkeyPatch, cost_s: float, rounds: int
) -> None:
    """Five fewest rounds asked for, a 10 s share: a model of 0.5 s a run fills the share (20 rounds),
    one of 4 s runs the two the share holds and the one that starts inside it (3), one of 45 s a run
    one round -- not five rounds (225 s) whatever the share. The rounds' count is a fixed function
    of the cost of one round."""
    from quantune.evaluate import interleave

    clock = FakeClock()
    monkeypatch.setattr(interleave.time, "perf_counter", clock)
    start = clock()
    timings = interleave.interleaved(
        [clock.call(cost_s)], 50, end=start + 10.0, fewest=5, share_s=10.0, after=lambda t: False
    )
    assert timings.shape == (1, rounds)
    assert np.allclose(timings, cost_s)


def test_the_ceilings_rounds_stand_for_the_originals_timing_when_its_own_would_run_no_more() -> None:
    """The original is timed alone again after the speed ceilings only when their rounds of it are
    fewer than its own timing would run: ten for a fast model, one for a model of 45 s a run (its
    own timing is one round in its share, and repeating it alone cost two more runs)."""
    from quantune.engine.run.original import RETIME_ROUNDS, stand_in_rounds
    from quantune.evaluate import LatencySpec

    spec = LatencySpec(warmup=10, repeats=50, seconds=10.0)
    assert stand_in_rounds(spec, np.full(3, 0.001)) == RETIME_ROUNDS
    assert stand_in_rounds(spec, np.full(3, 4.0)) == 3
    assert stand_in_rounds(spec, np.array([45.0])) == 1


def test_a_targets_rounds_in_batches_stop_at_the_share_by_the_same_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend that times batches of rounds elsewhere (a target's server) follows the same rule:
    after the first batch (two rounds, the ceilings' early ones), rounds of 125 s against a 30 s
    share stop there -- not at the five rounds of a paired decision."""
    import time as clock_module

    from quantune.evaluate.rounds import decide_in_chunks

    clock = FakeClock()
    monkeypatch.setattr(clock_module, "perf_counter", clock)
    costs = np.array([45.0, 30.0, 50.0])
    batches: list[int] = []

    def timings(models, spec, first):
        rows = np.array([np.nan if m is None else cost for m, cost in zip(models, costs, strict=True)])
        jitter = np.array([[1.0 + 0.2 * ((first + r) % 2)] for r in range(spec.repeats)]).T  # never decided
        clock.now += float(np.nansum(rows)) * spec.repeats
        batches.append(spec.repeats)
        return rows[:, None] * jitter

    models = (Path("original.onnx"), Path("a.onnx"), Path("b.onnx"))
    request = TimingRequest(models, {}, LatencySpec(seconds=10.0), threshold=0.97, early=True, max_rounds=20)
    done = decide_in_chunks(timings, request)
    assert done.shape == (3, 2) and batches == [2]
