"""The confirmation's re-timing stops once its verdict is settled (issue 23): a model surely faster
(or surely not) needs no 50 rounds to say so, while a close call keeps every round. The rule is
judged on built timings (behaviour, not speed); the early stop on real sessions, here and in a
target environment (this interpreter), by the rounds that ran."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from conftest import build_mlp, mlp_inputs
from quantune.engine.measure.confirm import verdict_settled
from quantune.evaluate import LatencySpec, TargetBackend, TimingRequest, time_side_by_side
from quantune.evaluate.latency import SETTLE_EVERY, SETTLE_FROM


def _rounds(ratios: list[float], rounds: int = 10, jitter: float = 0.01, seed: int = 0) -> np.ndarray:
    """Timings of the original (row 0) and one row per candidate at ``ratio`` of its time, each round
    disturbed alike (the machine) and a little apart (noise)."""
    rng = np.random.default_rng(seed)
    original = 0.010 * (1.0 + rng.uniform(0.0, 0.5, rounds))  # a drifting machine
    rows = [original] + [original * ratio * (1.0 + rng.uniform(-jitter, jitter, rounds)) for ratio in ratios]
    return np.stack(rows)


def test_a_clear_verdict_is_settled_at_ten_rounds_a_close_call_is_not():
    assert verdict_settled(_rounds([0.45]))  # surely faster
    assert verdict_settled(_rounds([1.30]))  # surely slower
    assert not verdict_settled(_rounds([0.98], jitter=0.03))  # on the line: more rounds
    # a runner-up: surely 2%+ behind the fastest, or surely within 2% of it (a tie) -- both settled
    assert verdict_settled(_rounds([0.45, 0.60]))
    assert verdict_settled(_rounds([0.45, 0.452], jitter=0.001))
    # 2% behind within the noise: whether it is a tie is not known yet
    assert not verdict_settled(_rounds([0.45, 0.459], jitter=0.02))


def test_one_disturbed_round_in_ten_keeps_the_rounds_going():
    timings = _rounds([0.45])
    timings[1, 3] = timings[0, 3] * 1.5  # the candidate's run in round 4 met other work
    assert not verdict_settled(timings)  # the 99% interval needs all ten on one side
    more = _rounds([0.45], rounds=13, seed=1)
    more[1, 3] = more[0, 3] * 1.5
    assert verdict_settled(more)  # three rounds later it is settled again


def test_local_rounds_stop_when_settled_and_are_asked_at_the_planned_rounds(tmp_path: Path):
    model = build_mlp(tmp_path / "m.onnx")
    feed = {"x": mlp_inputs(1, 0)}
    spec = LatencySpec(warmup=1, repeats=40, threads=1)
    asked: list[int] = []

    def after_sixteen(timings: np.ndarray) -> bool:
        asked.append(timings.shape[1])
        return timings.shape[1] >= 16

    timings = time_side_by_side([model, model], feed, spec, settled=after_sixteen)
    assert timings.shape == (2, 16)
    assert asked == [SETTLE_FROM, SETTLE_FROM + SETTLE_EVERY, SETTLE_FROM + 2 * SETTLE_EVERY]
    assert time_side_by_side([model], feed, spec, settled=lambda _: False).shape == (1, 40)  # never settled


def test_a_target_environment_stops_its_rounds_when_settled(tmp_path: Path):
    model = build_mlp(tmp_path / "m.onnx")
    feed = {"x": mlp_inputs(1, 0)}
    backend = TargetBackend(sys.executable)
    asked: list[int] = []

    def after_thirteen(timings: np.ndarray) -> bool:
        asked.append(timings.shape[1])
        return timings.shape[1] >= SETTLE_FROM + SETTLE_EVERY

    try:
        spec = LatencySpec(warmup=1, repeats=40, threads=1)
        timings = backend.time(TimingRequest((model, model), feed, spec, None, settled=after_thirteen))
        assert timings.shape == (2, SETTLE_FROM + SETTLE_EVERY)
        assert (timings > 0).all()
        assert asked == [SETTLE_FROM, SETTLE_FROM + SETTLE_EVERY]
        never = backend.time(
            TimingRequest((model,), feed, LatencySpec(warmup=1, repeats=17, threads=1), None, settled=lambda _: False)
        )
        assert never.shape == (1, 17)
    finally:
        backend.close()


def test_the_original_goes_on_alone_when_the_ceilings_decide_early(tmp_path: Path):
    """The ceilings' rounds time the original first in each, and its latency is read from them; when
    the candidates are decided in fewer rounds than that needs, the original alone goes on in its
    warm session (not a fresh session and 60 runs alone), the candidates' rows left empty."""
    from quantune.evaluate import rounds

    original = build_mlp(tmp_path / "m.onnx")
    other = build_mlp(tmp_path / "other.onnx", seed=1)
    feed = {"x": mlp_inputs(1, 0)}
    spec = LatencySpec(warmup=1, repeats=50, threads=1)
    plain = rounds.time_until_decided(
        TimingRequest((original, other), feed, spec, threshold=1e-6, min_rounds=5, max_rounds=20)
    )
    assert plain.shape[1] == 5  # surely above a threshold near 0: decided at the fewest rounds
    timings = rounds.time_until_decided(
        TimingRequest((original, other), feed, spec, threshold=1e-6, min_rounds=5, max_rounds=20, original_rounds=8)
    )
    assert timings.shape == (2, 8)
    assert not np.isnan(timings[0]).any()
    assert not np.isnan(timings[1, :5]).any() and np.isnan(timings[1, 5:]).all()
    backend = TargetBackend(sys.executable)
    try:
        there = backend.time(
            TimingRequest(
                (original, other), feed, spec, None, threshold=1e-6, min_rounds=5, max_rounds=20, original_rounds=8
            )
        )
    finally:
        backend.close()
    assert there.shape == (2, 8) and not np.isnan(there[0]).any() and np.isnan(there[1, 5:]).all()
