"""The speed ceilings' models are built while the original is evaluated (engine/measure/prebuild.py):
the strategy's own ceiling stage then only times them, and nothing it decides changes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import quantune
from conftest import accuracy_problem
from quantune.engine.measure.ahead import GUESS_BUILDS
from quantune.engine.measure.prebuild import ceiling_items
from quantune.strategy import create_strategy
from quantune.strategy.base import Outcome

DYNAMIC = [{"name": "dynamic_quant", "search": True}]
STATIC = [{"name": "static_quant", "search": True, "params": {"calibration_samples": 16}}]


def _speed_first(make_config, passes, **overrides) -> dict:
    return make_config(
        passes=passes,
        search={"strategy": "quantune", "seed": 0, "strategy_options": {"drop_slow": False}},
        evaluation={"metric": "top1", "latency": {"warmup": 1, "repeats": 5, "threads": 1}},
        **overrides,
    )


def test_the_declared_first_requests_are_the_points_the_ceilings_will_time(make_config) -> None:
    config = _speed_first(make_config, STATIC)
    timed: list = []

    def ratios(items, threshold, budget_s, **keywords):  # the real ceiling stage's probe, answering "not faster"
        timed.append([(dict(point), tuple(flow)) for point, flow in items])
        return [1.5] * len(items)

    options = {"drop_slow": False, "first_guess": True}
    problem = dataclasses.replace(accuracy_problem(config, options, timed=True), ceiling_ratios=ratios)
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    items, _, first, _ = ceiling_items(strategy, lambda: create_strategy("quantune"))
    assert items and all(flow == ("static_quant",) for _, flow in items)
    assert len(items) == len({json.dumps(point, sort_keys=True) for point, _ in items})  # distinct variants
    assert first in items  # the first guess is one of the ceilings, evaluated before they are timed
    assert timed == []  # declaring them timed nothing
    # the real strategy, untouched by the fresh one that declared them, asks for that guess, then times exactly those points
    strategy.observe_baseline({"top1": 1.0, "latency_ms": 1.0})
    proposal = strategy.ask()
    assert proposal.stage.startswith("first guess") and (dict(proposal.point), tuple(proposal.flow)) == first
    assert timed == []
    strategy.tell(proposal, Outcome(1.0, meets=False, violation=0.5))
    strategy.ask()
    assert timed == [items]


def test_without_a_first_guess_the_ceilings_come_first(make_config) -> None:
    config = _speed_first(make_config, STATIC)
    problem = accuracy_problem(config, {"drop_slow": False, "first_guess": False}, timed=True)
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    items, _, first, _ = ceiling_items(strategy, lambda: create_strategy("quantune"))
    assert items and first is None


def test_a_strategy_that_does_not_start_with_ceilings_gets_nothing_built(make_config) -> None:
    config = make_config(passes=DYNAMIC, search={"strategy": "joint", "sampler": "random", "seed": 0})
    problem = accuracy_problem(config, timed=True)
    strategy = create_strategy("joint")
    strategy.bind(problem)
    assert ceiling_items(strategy, lambda: create_strategy("joint")) == ([], None, None, [])


def _run(config: dict, out: Path, monkeypatch: pytest.MonkeyPatch, prebuild: bool) -> dict:
    monkeypatch.setenv("QUANTUNE_PREBUILD", "1" if prebuild else "0")
    quantune.tune(config, output=out)
    return json.loads((out / "results.json").read_text())


def _labels(results: dict) -> list[str]:
    """The ceiling decisions' variant labels, in the order the strategy made them (not the timings)."""
    decisions = results["strategy"].get("decisions") or []
    return [d.split(" kept")[0].split(" dropped")[0] for d in decisions if " kept" in d or " dropped" in d]


def test_a_run_builds_its_ceilings_beside_the_original_and_decides_the_same(make_config, tmp_path, monkeypatch):
    executor = {"executor": {"kind": "process", "workers": 1}}
    ahead = _speed_first(make_config, STATIC, stop={"max_trials": 2}, **executor)
    ahead["search"]["strategy_options"]["first_guess"] = True  # without the builds ahead too (evaluated in turn)
    ahead["cache_dir"] = str(tmp_path / "cache-ahead")
    plain = {**ahead, "cache_dir": str(tmp_path / "cache-plain")}
    with_prebuild = _run(ahead, tmp_path / "ahead", monkeypatch, prebuild=True)
    without = _run(plain, tmp_path / "plain", monkeypatch, prebuild=False)
    assert "ceiling_build" in with_prebuild["stage_peak_rss_mb"]
    assert "ceiling_build" not in without["stage_peak_rss_mb"]
    assert (tmp_path / "ahead" / "workers" / "ceiling_build.log").is_file()
    # built ahead, the ceilings are only timed, here: no worker of their own
    assert "speed_ceiling" in without["stage_peak_rss_mb"]
    assert "speed_ceiling" not in with_prebuild["stage_peak_rss_mb"]
    assert not (tmp_path / "ahead" / "workers" / "speed_ceiling.log").exists()
    # so is the original's node profile, profiled beside its evaluation
    assert "node_profile" not in with_prebuild["stage_peak_rss_mb"]
    assert list((tmp_path / "cache-ahead").rglob("profiles/*"))
    log = (tmp_path / "ahead" / "quantune.log").read_text()
    built = [line for line in log.splitlines() if "speed ceilings built ahead" in line]
    assert built and " 0 of " not in built[0]
    assert _labels(with_prebuild) == _labels(without) and _labels(with_prebuild)
    # the same trials, as far as both went: whether a tiny model's first guess already ends the search
    # (at its ceiling, or every ceiling slower than fp32) rests on its timings, which differ run to run
    flows = [[t["flow"] for t in run["trials"]] for run in (with_prebuild, without)]
    common = min(len(f) for f in flows)
    assert common >= 1 and flows[0][:common] == flows[1][:common]
    # the original's latency was timed again once the builds were done (the same figures' names):
    # the quick timing beside them is no longer what the cache holds
    assert with_prebuild["baseline"].keys() == without["baseline"].keys()
    cached = [json.loads(p.read_text())["value"] for p in (tmp_path / "cache-ahead" / "evals").glob("*.json")]
    original = [entry for entry in cached if entry.get("metrics", {}).get("quantized_ops") == 0]
    assert original and not any(entry.get("quick_timing") for entry in original)
    # the first guess was built and evaluated beside the original: its trial read both from the cache,
    # and the evaluation counts as this run's work (a "miss": it was computed, ahead)
    first = with_prebuild["trials"][0]
    assert first["stage"].startswith("first guess") and first["cache"] == {"static_quant": "hit", "evaluation": "miss"}
    assert "the original's reference waited" in (tmp_path / "ahead" / "workers" / "first_guess.log").read_text()
    assert without["trials"][0]["stage"] == first["stage"] and without["trials"][0]["cache"]["evaluation"] == "miss"
    assert first["metrics"]["top1"] == without["trials"][0]["metrics"]["top1"]  # the same model, evaluated alike


def test_a_first_guess_evaluated_by_an_earlier_run_is_a_cache_hit(make_config, tmp_path, monkeypatch) -> None:
    """Evaluated ahead, the first guess counts as the run's own evaluation; a later run reading
    the same figures from the cache counts a hit, as for any other trial."""
    config = _speed_first(make_config, STATIC, stop={"max_trials": 1}, executor={"kind": "process", "workers": 1})
    config["search"]["strategy_options"]["first_guess"] = True
    config["cache_dir"] = str(tmp_path / "cache")
    first = _run(config, tmp_path / "one", monkeypatch, prebuild=True)["trials"][0]
    again = _run(config, tmp_path / "two", monkeypatch, prebuild=True)["trials"][0]
    assert first["stage"] == again["stage"] and first["stage"].startswith("first guess")
    assert first["cache"]["evaluation"] == "miss" and again["cache"]["evaluation"] == "hit"
    assert first["metrics"]["top1"] == again["metrics"]["top1"]


def test_only_cached_answers_from_the_cache_or_raises(make_config, tmp_path) -> None:
    from quantune.model import ModelHandle
    from quantune.passes import get_pass
    from quantune.passes.cached import NotCached, only_cached, run_pass_cached
    from quantune.store import ArtifactCache

    model = ModelHandle.from_path(make_config()["model"])
    cache = ArtifactCache(tmp_path / "c")
    dynamic = get_pass("dynamic_quant")
    config = dynamic.Config()
    common = {"calibration": None, "input_names": model.input_names(), "batch_size": 1, "label": "dynamic_quant"}
    with only_cached(), pytest.raises(NotCached):
        run_pass_cached(cache, dynamic, config, model.path, model.sha256, **common)
    built, sha, hit = run_pass_cached(cache, dynamic, config, model.path, model.sha256, **common)
    assert not hit
    with only_cached():
        assert run_pass_cached(cache, dynamic, config, model.path, model.sha256, **common) == (built, sha, True)


def test_the_builds_queue_is_worked_from_both_ends_and_one_worker_calibrates(tmp_path: Path) -> None:
    """Two workers on one list: each item built once; the second takes the light items first and a
    calibrating one only after a calibrating build finished (the ranges are then cached)."""
    import threading

    from quantune.engine.measure.ahead import Queue, calibrates
    from quantune.forkserver import worker_context

    passes = {"s": "static_quant", "d": "dynamic_quant", "t": "transformer_opt"}
    flows = [("s",), ("s",), ("s",), ("d",), ("t", "d")]
    heavy = tuple(calibrates(flow, passes) for flow in flows)
    assert heavy == (True, True, True, False, False)
    queue = Queue.open(heavy, worker_context())
    log: list[tuple[str, int, bool]] = []
    calibrating, light_done = threading.Event(), threading.Event()

    def front() -> None:
        for index in queue.take():
            log.append(("front", index, queue.calibrated.is_set()))
            if index == 0:  # calibrating while the other worker builds the light items
                calibrating.set()
                assert light_done.wait(600)  # the bound only ends a broken test

    def back() -> None:
        calibrating.wait(600)
        for index in dataclasses.replace(queue, reverse=True).take():
            log.append(("back", index, queue.calibrated.is_set()))
            if index == 3:
                light_done.set()

    threads = [threading.Thread(target=front), threading.Thread(target=back)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert sorted(index for _, index, _ in log) == list(range(5))  # each once
    assert log[0] == ("front", 0, False)
    assert [index for name, index, _ in log if name == "back"][:2] == [4, 3]  # light first, from the end
    assert all(ready for name, index, ready in log if name == "back" and heavy[index])  # it never calibrates


def test_the_strategy_declares_its_first_requests_without_measuring_anything(make_config) -> None:
    """Prebuilding asks the strategy what it will ask first (``first_requests``): declared from the bound
    problem, no probe called and nothing proposed; a strategy that does not start with ceilings
    declares nothing."""

    def measure(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("declaring the first requests measured something")

    probes = {name: measure for name in ("ceiling_ratios", "latency_ratio", "paired_latency", "sensitivity")}
    config = _speed_first(make_config, STATIC)
    options = {"drop_slow": False, "first_guess": True}
    problem = dataclasses.replace(accuracy_problem(config, options, timed=True), evaluates_ahead=True, **probes)
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    items, _, first, _ = strategy.first_requests()
    assert first is not None and first in items and strategy.stage_log == []
    joint = create_strategy("joint")
    joint.bind(accuracy_problem(make_config(passes=DYNAMIC), timed=True))
    assert joint.first_requests() == ([], None, None, [])


def _guess_in_budget_then_dies(spec: Any, first: Any, later: Any, wait_s: float, line: Any, *rest: Any) -> None:
    """Stands in for evaluate_ahead in the first guess's worker: a guess in budget, then killed mid-build."""
    import os
    import signal

    line.say("guess", GUESS_BUILDS)
    os.kill(os.getpid(), signal.SIGKILL)


def _guess_in_budget_waits_for_the_ceilings(spec: Any, first: Any, later: Any, wait_s: float, line: Any, *rest: Any):
    """Stands in for evaluate_ahead: a guess in budget, three models built, then ``later`` evaluated
    only if the engine said the ceilings are timed."""
    line.say("guess", GUESS_BUILDS)
    line.say("built", 3)
    return True, [line.go.wait(wait_s)] * len(later)


def _builds_nothing(*args: Any) -> int:
    return 0


def _prebuild(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, guess: Any) -> Any:
    from quantune.engine.executors.stage import Isolation
    from quantune.engine.measure import prebuild

    monkeypatch.setattr(prebuild, "evaluate_ahead", guess)
    monkeypatch.setattr(prebuild, "build_variants", _builds_nothing)
    item = ({"d.x": 1}, ("d",))
    return prebuild.Prebuild(None, [item], [False], None, Isolation(log_dir=tmp_path), ({}, ("s",)), [({}, ("t",))])


def test_a_first_guess_worker_that_dies_is_noticed_and_leaves_no_files(tmp_path: Path, monkeypatch) -> None:
    """The engine hears the guess's worker on a line it made (no marker files, nothing polled): a
    worker that dies after saying its guess is in budget does not leave the builds waiting for it."""
    ahead = _prebuild(tmp_path, monkeypatch, _guess_in_budget_then_dies)
    assert ahead.wait_first_guess(600)  # the bound only ends a broken test
    ahead.join(builds_only=True)  # returns: the dead worker's share is counted as none built
    assert ahead.built == 0 and ahead.ahead() == [({}, ("s",))]
    assert {path.suffix for path in ahead._tmp.iterdir()} <= {".log"}  # its work folder holds logs only
    ahead.cancel()


def test_the_guess_s_worker_evaluates_later_once_the_engine_says_the_ceilings_are_timed(tmp_path, monkeypatch) -> None:
    ahead = _prebuild(tmp_path, monkeypatch, _guess_in_budget_waits_for_the_ceilings)
    assert ahead.wait_first_guess(600)
    ahead.join(builds_only=True)
    assert ahead.built == 3  # its share, as it said
    assert ahead.wait_ahead({}, ("t",))  # says the ceilings are timed, then waits for ``later``
    assert ahead.ahead() == [({}, ("s",)), ({}, ("t",))]
    ahead.cancel()
