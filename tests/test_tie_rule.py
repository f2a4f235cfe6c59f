"""The end of a latency run breaks ties by a fixed rule (issue 23, reproducible): models that the
side-by-side re-timing cannot tell apart go to the earliest trial -- not to whichever median the
noise put lowest this time."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from quantune.engine.measure.confirm import Confirmation, _ties
from quantune.engine.outcome.verdict import decide
from quantune.engine.trials.trial import TrialRecord
from quantune.evaluate import paired_ratio
from quantune.strategy import Outcome


def _record(number: int, latency_ms: float, size: float, path: str, **params: object) -> TrialRecord:
    return TrialRecord(
        number=number,
        flow=["static_quant"],
        params={f"static_quant.{k}": v for k, v in params.items()} or {"static_quant.weight_type": path},
        status="ok",
        metrics={"latency_ms": latency_ms, "size_bytes": size, "quantized_compute_ops": 1.0},
        meets_criterion=True,
        accuracy_loss=0.0,
        model_path=path,
    )


def _rounds(center: float, spread: float, seed: int, n: int = 30) -> np.ndarray:
    return center * (1.0 + spread * np.random.default_rng(seed).standard_normal(n))


def test_models_within_the_noise_are_tied_and_the_earlier_trial_wins() -> None:
    original = _rounds(2.0, 0.01, 0)
    early, late = _record(3, 1.01, 100.0, "a.onnx"), _record(7, 0.99, 100.0, "b.onnx")
    by_model = {"a.onnx": original * 0.505, "b.onnx": original * 0.495}  # 2% apart, round by round
    ties = _ties([early, late], by_model)
    assert sorted(ties) == [3, 7]
    ratios = {3: paired_ratio(by_model["a.onnx"], original), 7: paired_ratio(by_model["b.onnx"], original)}
    confirmation = Confirmation([early, late], 2.0, rounds=30, ratios=ratios, ties=ties)
    verdict = decide([early, late], ["latency"], {"latency_ms": 2.0}, confirmation=confirmation)
    assert verdict.best is not None and verdict.best.number == 3  # not trial 7, the lower median


def test_a_model_faster_beyond_the_noise_is_not_tied() -> None:
    original = _rounds(2.0, 0.01, 1)
    slow, fast = _record(2, 1.2, 100.0, "a.onnx"), _record(5, 0.8, 100.0, "b.onnx")
    assert _ties([slow, fast], {"a.onnx": original * 0.6, "b.onnx": original * 0.4}) == [5]


def test_a_tie_goes_to_the_earlier_trial_even_when_the_later_is_smaller(tmp_path: Path) -> None:
    original = _rounds(2.0, 0.01, 2)
    big, small = _record(1, 1.0, 200.0, "a.onnx"), _record(4, 1.0, 100.0, "b.onnx")
    by_model = {"a.onnx": original * 0.5, "b.onnx": original * 0.5}
    ratios = {n: paired_ratio(by_model[p], original) for n, p in ((1, "a.onnx"), (4, "b.onnx"))}
    confirmation = Confirmation([big, small], 2.0, rounds=30, ratios=ratios, ties=_ties([big, small], by_model))
    verdict = decide([big, small], ["latency"], {"latency_ms": 2.0}, confirmation=confirmation)
    assert verdict.best is not None and verdict.best.number == 1  # the stable contender, not a byte fewer


def test_the_earliest_trial_as_fast_by_the_search_figures_is_re_timed_too(tmp_path: Path) -> None:
    """Which near-equal models make the top ``confirm_top`` follows the noise; the earliest one within
    the search's noise of the fastest takes the second place (the tie rule's stable contender)."""
    from quantune.engine.measure.confirm import _choose

    paths = []
    for name in "abcd":
        (tmp_path / f"{name}.onnx").write_bytes(b"x")
        paths.append(str(tmp_path / f"{name}.onnx"))
    records = [
        _record(1, 1.05, 100.0, paths[0]),  # the earliest, 5% slower by its one search-time timing
        _record(2, 1.60, 100.0, paths[1]),  # beyond the noise: never a contender
        _record(3, 1.00, 100.0, paths[2]),
        _record(4, 1.01, 100.0, paths[3]),
    ]
    _, chosen, _ = _choose(records, 2)
    assert chosen == [paths[2], paths[0]]  # the fastest, then the earliest as fast
    _, chosen, _ = _choose(records, 3)
    assert chosen == [paths[2], paths[0], paths[3]]
    _, chosen, _ = _choose(records, 1)
    assert chosen == [paths[2]]  # confirm_top 1: the fastest only


def test_trials_that_run_the_same_graph_are_one_contender(tmp_path: Path) -> None:
    """Trials that differ only in calibration settings run one executed graph: one contender, its
    figure the median of theirs (not the luckiest single timing), its model the most accurate."""
    from quantune.engine.measure.confirm import _choose, speed_class

    paths = []
    for name in "abcd":
        (tmp_path / f"{name}.onnx").write_bytes(b"x")
        paths.append(str(tmp_path / f"{name}.onnx"))
    same = dict(weight_type="int8", per_channel=True)
    lucky = _record(0, 0.90, 100.0, paths[0], calibrate_method="MinMax", **same)
    rest = [
        _record(1, 1.10, 100.0, paths[1], calibrate_method="Entropy", **same),
        _record(2, 1.10, 100.0, paths[2], calibrate_method="Percentile", **same),
    ]
    rest[0].accuracy_loss = -0.01  # the most accurate of the class
    other = _record(3, 1.00, 100.0, paths[3], weight_type="uint8", per_channel=True, calibrate_method="MinMax")
    assert speed_class(lucky) == speed_class(rest[0]) != speed_class(other)
    _, chosen, _ = _choose([lucky, *rest, other], 1)
    assert chosen == [paths[3]]  # the class's median 1.10 ms, not its one lucky 0.90 ms
    _, chosen, _ = _choose([lucky, *rest, other], 2)
    assert chosen == [paths[3], paths[1]]  # the class's model: its most accurate trial


def test_contenders_with_equal_medians_are_ordered_by_trial(tmp_path: Path) -> None:
    """Equal search-time figures (a model timed once, cached, read again) order by trial number."""
    from quantune.engine.measure.confirm import _choose

    paths = []
    for name in "ab":
        (tmp_path / f"{name}.onnx").write_bytes(b"x")
        paths.append(str(tmp_path / f"{name}.onnx"))
    later, earlier = _record(5, 1.0, 100.0, paths[0]), _record(2, 1.0, 100.0, paths[1])
    _, chosen, _ = _choose([later, earlier], 1)
    assert chosen == [paths[1]]


def test_the_strategys_answer_is_the_stable_contender_and_takes_the_tie(tmp_path: Path) -> None:
    """Several in-budget models within a few percent (the NudeNet detector: five, the same run five
    times ended at three of them): the one the strategy settled on by paired timing is re-timed
    beside the fastest by search-time figures, and wins when the re-timing cannot tell them apart."""
    from quantune.engine.measure.confirm import _choose

    paths = []
    for name in "abcd":
        (tmp_path / f"{name}.onnx").write_bytes(b"x")
        paths.append(str(tmp_path / f"{name}.onnx"))
    records = [
        _record(12, 1.02, 100.0, paths[0]),
        _record(14, 1.00, 100.0, paths[1]),  # the fastest by its one search-time timing
        _record(16, 1.01, 100.0, paths[2]),
        _record(18, 1.04, 100.0, paths[3]),  # the strategy's answer (at the speed ceiling)
    ]
    _, chosen, stable = _choose(records, 2, prefer=18)
    assert chosen == [paths[1], paths[0], paths[3]] and stable == 18  # one more place for the answer
    _, chosen, stable = _choose(records, 2, prefer=12)  # the answer is the earliest as fast already
    assert chosen == [paths[1], paths[0]] and stable == 12
    _, chosen, stable = _choose(records, 2)  # no answer: the earliest within the noise, as before
    assert chosen == [paths[1], paths[0]] and stable == 12
    _, chosen, stable = _choose(records, 2, prefer=99)  # an answer that cannot be re-timed: as before
    assert chosen == [paths[1], paths[0]] and stable == 12

    original = _rounds(2.0, 0.01, 3)
    fastest, answer = records[1], records[3]
    by_model = {paths[1]: original * 0.58, paths[3]: original * 0.58}
    ratios = {14: paired_ratio(by_model[paths[1]], original), 18: paired_ratio(by_model[paths[3]], original)}
    ties = _ties([fastest, answer], by_model)
    assert sorted(ties) == [14, 18]
    confirmation = Confirmation([fastest, answer], 2.0, rounds=30, ratios=ratios, ties=ties, preferred=18)
    verdict = decide([fastest, answer], ["latency"], {"latency_ms": 2.0}, confirmation=confirmation)
    assert verdict.best is not None and verdict.best.number == 18  # not the earlier 14
    confirmation.preferred = None
    verdict = decide([fastest, answer], ["latency"], {"latency_ms": 2.0}, confirmation=confirmation)
    assert verdict.best is not None and verdict.best.number == 14


def test_the_quantune_strategy_answers_with_the_model_it_ended_on(tmp_path: Path) -> None:
    """Made-up outcomes: the fully quantized ceiling meets the budget, so the search ends there (its
    own ceiling is at the ceiling: no timing needed); ``answer`` names that trial for the confirmation."""
    from conftest import accuracy_problem
    from quantune.strategy import create_strategy
    from test_accuracy_strategies import scaled_config

    strategy = create_strategy("quantune")
    strategy.bind(accuracy_problem(scaled_config(tmp_path, "quantune", max_trials=10), {"latency_trials": 0}))
    assert strategy.answer() is None  # nothing settled yet
    count = 0
    while (proposal := strategy.ask()) is not None:
        excluded = proposal.point.get("static_quant.nodes_to_exclude")
        outcome = Outcome(1.0, 0.0, True, {"latency_ms": 1.0}, number=count + 7)
        strategy.tell(proposal, outcome)
        count += 1
        assert count < 20 and not excluded
    assert "speed ceiling" in strategy.finished_reason
    assert strategy.answer() == 7  # the first (and only) trial, the ceiling itself
