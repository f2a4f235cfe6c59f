"""Under a short ``stop.timeout_s`` the search comes first (issue 23, limits that mean what they
say): on the loaded machine four zoo models ended a 60 s run at 27-45 s with 0 trials, the first
guess (already evaluated beside the original, in the cache) refused as "about 29 s" with 12 s
kept for the end, 5 of them for the whole report's Optuna views. Only what a trial reads
(``_would_overrun``) is asked of a loop built whole; no timing is asserted."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from quantune.engine.run.deadline import EndBudget, TimeBudget
from quantune.engine.run.loop import RunLoop
from quantune.engine.trials.trial import TrialRecord
from robust_helpers import built_loop


def _loop(
    make_config: Any,
    store: Path,
    elapsed_s: float,
    timeout_s: float,
    first_trial_s: float,
    records: list[TrialRecord] | None = None,
    start_reserve_s: float | None = None,
    **given: Any,
) -> RunLoop:
    """A loop whose search has just begun, ``elapsed_s`` into a run of ``timeout_s`` that keeps 12 s
    for its end (the whole report's drawing too), after ``records``."""
    budget = TimeBudget(
        time.perf_counter() - elapsed_s,
        end_reserve_s=12.0,
        start_reserve_s=start_reserve_s,
        first_trial_s=first_trial_s,
    )
    loop = built_loop(make_config(stop={"timeout_s": timeout_s}), store, budget, **given)
    loop.records.extend(records or [])
    return loop


def test_a_trial_may_run_into_the_whole_reports_time_not_the_least_reports(make_config, tmp_path) -> None:
    assert _loop(make_config, tmp_path / "a.db", 21.0, 60.0, 29.0)._would_overrun(
        ("static_quant",)
    )  # 21 + 29 > 60 - 12
    # the same end with the page drawn without its Optuna views: 8 s
    loop = _loop(make_config, tmp_path / "b.db", 21.0, 60.0, 29.0, start_reserve_s=8.0)
    assert not loop._would_overrun(("static_quant",))  # 21 + 29 <= 60 - 8
    late = _loop(make_config, tmp_path / "c.db", 30.0, 60.0, 29.0, start_reserve_s=8.0)
    assert late._would_overrun(("static_quant",)) and "8 s kept" in late._overrun_reason


def test_a_proposal_evaluated_ahead_is_never_refused_for_time(make_config, tmp_path) -> None:
    point, flow = {"flow": "static_quant", "static_quant.quant_format": "QDQ"}, ("static_quant",)
    loop = _loop(make_config, tmp_path / "run.db", 50.0, 60.0, 29.0, evaluated_ahead=[(dict(point), flow)])
    assert loop._ahead(point, flow)
    assert not loop._ahead({**point, "static_quant.quant_format": "QOperator"}, flow)
    assert not loop._ahead(point, ("dynamic_quant",))


def test_a_cache_hit_does_not_make_the_next_trial_look_quick(make_config, tmp_path) -> None:
    """The first guess read from the cache took 0.1 s: the next real trial is still expected to take
    what the original's evaluation suggests, not 0.1 s."""
    hit = TrialRecord(0, ["static_quant"], {}, "ok", durations={"total_s": 0.1}, cache={"evaluation": "hit"})
    loop = _loop(make_config, tmp_path / "run.db", 40.0, 60.0, 29.0, [hit], start_reserve_s=8.0)
    assert loop._would_overrun(("static_quant",))  # 40 + 29 > 52, though the hit took 0.1 s


def test_the_start_reserve_keeps_the_least_report_only() -> None:
    end = EndBudget(60.0, time.perf_counter(), end_s=0.5, report_s=5.0, load_s=0.1, least_report_s=1.0)
    full, start = end.reserve_s(100.0, 1, 2, 5), end.start_reserve_s(100.0, 1, 2, 5)
    assert full - start == 4.0  # the whole page's extra seconds
    assert EndBudget(None, 0.0).start_reserve_s(100.0, 1, 2, 5) == 0.0


def test_waiting_for_the_builds_ahead_ends_at_the_runs_limit() -> None:
    """A speed ceiling's build still running at the run's limit is stopped, not waited for: the
    builds' stages watch their deadline (engine/executors/stage.py), which the join moves to now."""
    import threading

    from quantune.engine.executors.stage import Isolation, StageDeadline
    from quantune.engine.measure.prebuild import Prebuild

    prebuild = Prebuild.__new__(Prebuild)  # only what join reads
    prebuild._isolation = Isolation(deadline=StageDeadline())

    def build() -> None:  # as run_stage waits: until its deadline comes
        while prebuild._isolation.deadline.left_s() != 0.0:
            time.sleep(0.02)

    prebuild._threads = [threading.Thread(target=build, daemon=True)]
    prebuild._threads[0].start()
    prebuild.join(time.perf_counter() + 0.1)
    assert not prebuild._threads[0].is_alive()
    assert "stop.timeout_s" in prebuild._isolation.deadline.reason


def test_the_ceilings_timing_starts_no_round_past_the_runs_limit(tmp_path) -> None:
    """The fewest rounds are for the ceilings' own budget; the run's limit cuts them (one round)."""
    from conftest import build_mlp, mlp_inputs
    from quantune.evaluate.latency import LatencySpec, TimingRequest
    from quantune.evaluate.rounds import time_until_decided

    path = build_mlp(tmp_path / "m.onnx")
    feeds = {"x": mlp_inputs(1, 0)}
    spec = LatencySpec(warmup=1, repeats=20, threads=1)
    past = time.perf_counter() - 1.0
    cut = time_until_decided(TimingRequest((path, path, path), feeds, spec, threshold=0.97, limit=past))
    assert cut.shape == (3, 1)
    whole = time_until_decided(TimingRequest((path, path), feeds, spec, threshold=0.97, min_rounds=5, max_rounds=5))
    assert whole.shape == (2, 5)
