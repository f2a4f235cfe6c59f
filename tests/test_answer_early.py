"""Answer as soon as the answer is known (issue 23, the strategy side).

The ``quantune`` strategy ends when a model in budget sits at the speed ceiling of the fastest
variant still in play; its latency stage changes only parameters that change the executed
graph, compares each candidate with the incumbent side by side and ends after a few that are
not faster; a byte-identical model is never timed twice; and the stages whose decisions do
not rest on timing give the same trials, in the same order, run after run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantune
from conftest import INLINE_EXECUTOR, accuracy_problem
from layernorm_model import build_layernorm_mlp, layernorm_data
from quantune.passes import get_pass
from quantune.space import Point
from quantune.strategy import WAIT, Outcome, create_strategy
from test_ceilings_fast import build_chain


def _drive(strategy: Any, judge, limit: int = 60) -> list[tuple[Point, str]]:
    """ask/tell without the engine; returns (point, stage) in order."""
    seen = []
    for _ in range(limit):
        proposal = strategy.ask()
        if proposal is None:
            break
        assert proposal is not WAIT
        strategy.tell(proposal, judge(proposal.point))
        seen.append((proposal.point, proposal.stage))
    return seen


def _static_config(make_config, **params: Any) -> dict[str, Any]:
    passes = [{"name": "static_quant", "search": True, "params": params}]
    return make_config(passes, search={"strategy": "quantune"}, stop={"max_trials": 20})


def _fast(point: Point, flow: tuple[str, ...]) -> float:
    return 0.5  # every ceiling twice as fast as the original


def _all_meet(point: Point) -> Outcome:
    return Outcome(1.0, 0.0, True, {"latency_ms": 1.0})


# -- 1. done when nothing faster is possible ----------------------------------------------------------


def test_an_in_budget_ceiling_ends_the_search_and_says_why(make_config) -> None:
    """The fastest kept ceiling meets the criterion: no fallback nor setting of it can be faster."""
    problem = dataclasses.replace(accuracy_problem(_static_config(make_config)), latency_ratio=_fast)
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    strategy.observe_baseline({"latency_ms": 1.0})
    seen = _drive(strategy, _all_meet)
    assert [stage for _, stage in seen] == [seen[0][1]] and seen[0][1].startswith("ceiling")
    reason = strategy.finished_reason
    assert "speed ceiling of the fastest variant" in reason and "nothing faster is possible" in reason
    stage, _, tried = seen[0][1].partition(": ")
    assert reason.startswith(f"the {stage} stage: ") and f"({tried})" in reason  # names the stage and the trial


def test_stop_at_ceiling_false_goes_on_to_the_latency_stage(make_config) -> None:
    options = {"stop_at_ceiling": False}
    problem = dataclasses.replace(accuracy_problem(_static_config(make_config), options), latency_ratio=_fast)
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    strategy.observe_baseline({"latency_ms": 1.0})
    stages = [stage for _, stage in _drive(strategy, _all_meet)]
    assert any(stage.startswith("latency") for stage in stages)
    assert "speed ceiling" not in strategy.finished_reason


def test_a_fallback_at_the_ceiling_side_by_side_ends_the_search(make_config) -> None:
    """The ceiling misses; the first fallback that meets times within the noise of it (paired): no
    bisection, prune or latency trial follows."""
    calls: list[tuple[Point, Point]] = []

    def paired(candidate: Point, cflow: Any, reference: Point, rflow: Any) -> dict[str, Any]:
        calls.append((candidate, reference))
        return {"ratio_median": 0.99, "ratio_ci_low": 0.95, "ratio_ci_high": 1.03, "faster": False}

    problem = dataclasses.replace(
        accuracy_problem(_static_config(make_config)), latency_ratio=_fast, paired_latency=paired
    )
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    strategy.observe_baseline({"latency_ms": 1.0})

    def judge(point: Point) -> Outcome:  # anything with a node in fp32 meets
        meets = bool(point.get("static_quant.nodes_to_exclude"))
        return Outcome(1.0, 0.0 if meets else 0.1, meets, {"latency_ms": 1.0})

    seen = _drive(strategy, judge)
    assert calls, "no paired timing against the ceiling"
    # every ceiling here is 0.5x: the fallback is built in each tied variant too (test_tied_variants.py)
    last = [item for item in seen if "the same fallback in" not in item[1]][-1]
    assert judge(last[0]).meets and not last[1].startswith(("prune", "latency"))
    assert "nothing faster is possible" in strategy.finished_reason


def test_a_lighter_model_faster_side_by_side_is_tried_before_the_ceiling_ends_the_search(tmp_path: Path) -> None:
    """The fully quantized ceiling meets, but the same model with only its compute ops int8 (fewer
    Q/DQ pairs) is faster side by side: it is evaluated and the search goes on from it, instead of
    calling the ceiling the end."""

    def paired(candidate: Point, cflow: Any, reference: Point, rflow: Any) -> dict[str, Any]:
        lighter = bool(candidate.get("static_quant.nodes_to_exclude")) and not reference.get(
            "static_quant.nodes_to_exclude"
        )
        ratio = 0.8 if lighter else 1.0
        return {"ratio_median": ratio, "ratio_ci_low": ratio - 0.02, "ratio_ci_high": ratio + 0.02, "faster": lighter}

    config = _layernorm(tmp_path, "latency")  # MatMuls, and the Add/Mul/Div of its LayerNorms
    problem = dataclasses.replace(accuracy_problem(config), latency_ratio=_fast, paired_latency=paired)
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    strategy.observe_baseline({"latency_ms": 1.0})
    seen = _drive(strategy, _all_meet)
    stages = [stage for _, stage in seen]
    lighter = [i for i, stage in enumerate(stages) if stage.startswith("lighter")]
    assert lighter, stages
    assert seen[lighter[0]][0].get("static_quant.nodes_to_exclude"), "the lighter model keeps non-compute ops float"
    assert "nothing faster is possible" not in (strategy.finished_reason or "")


def test_a_fallback_faster_than_a_slow_ceiling_is_no_reason_to_stop(make_config) -> None:
    """A variant kept only by ``drop_slow: false`` bounds nothing: the search goes on."""
    problem = dataclasses.replace(
        accuracy_problem(_static_config(make_config), {"drop_slow": False}), latency_ratio=lambda p, f: 1.5
    )
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    strategy.observe_baseline({"latency_ms": 1.0})
    _drive(strategy, _all_meet)
    assert "speed ceiling" not in strategy.finished_reason


def _matmul_config(tmp_path: Path) -> dict[str, Any]:
    model = build_chain(tmp_path / "chain.onnx", 3, 128)
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "calib.npz", x=rng.normal(0, 1, (32, 128)).astype(np.float32))
    np.savez(tmp_path / "eval.npz", x=rng.normal(0, 1, (32, 128)).astype(np.float32))
    return {
        "model": str(model),
        "prepare": "off",
        "data": {"calibration": str(tmp_path / "calib.npz"), "evaluation": str(tmp_path / "eval.npz"), "batch_size": 8},
        "evaluation": {"metric": "cosine", "latency": {"warmup": 1, "repeats": 5, "threads": 1}},
        "criterion": {"type": "relative", "tolerable_loss": 0.2},
        "passes": [{"name": "dynamic_quant", "params": {"weight_type": "int8", "pre_optimize": "none"}}],
        # whatever this loaded machine times, the one variant is kept (below 2x the original)
        "search": {"strategy": "quantune", "strategy_options": {"speed_margin": -1.0}},
        "stop": {"max_trials": 10},
        "cache_dir": str(tmp_path / "cache"),
        **INLINE_EXECUTOR,
    }


def test_a_real_run_stops_at_the_ceiling_before_max_trials(tmp_path: Path) -> None:
    result = quantune.tune(_matmul_config(tmp_path), output=tmp_path / "run")
    assert len(result.trials) == 1 < 10, [t.stage for t in result.trials]
    assert result.trials[0].meets_criterion and result.trials[0].stage.startswith("ceiling")
    assert "nothing faster is possible" in result.stop_reason
    assert "speed ceiling of the fastest variant" in result.stop_reason
    # the stop reason names the stage and the trial, as a person says it
    assert f"the ceiling stage: trial {result.trials[0].number} (" in result.stop_reason, result.stop_reason


# -- 2. a latency stage that only samples what changes speed ---------------------------------------


def test_the_latency_stage_changes_only_graph_parameters(make_config) -> None:
    """From the model in budget, each latency trial changes one parameter that changes the executed
    graph; calibration-only ones (calibrate_method, percentile, reduce_range) are never re-sampled."""
    config = _static_config(make_config, weight_type={"search": ["int8", "uint8"]})
    problem = dataclasses.replace(accuracy_problem(config, {"stop_at_ceiling": False}), latency_ratio=_fast)
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    strategy.observe_baseline({"latency_ms": 1.0})
    seen = _drive(strategy, _all_meet)
    [(incumbent, _)] = [(p, s) for p, s in seen if s.startswith("ceiling")]
    latency = [p for p, s in seen if s.startswith("latency")]
    assert latency, [s for _, s in seen]
    graph = {f"static_quant.{name}" for name in get_pass("static_quant").graph_params}
    for point in latency:
        changed = {k for k in set(point) | set(incumbent) if point.get(k) != incumbent.get(k)}
        assert len(changed) == 1 and changed <= graph, changed
    assert {k for p in latency for k in p if p.get(k) != incumbent.get(k)} == {
        "static_quant.per_channel",
        "static_quant.weight_type",
    }


def test_the_latency_stage_ends_after_candidates_that_are_not_faster(make_config) -> None:
    """``latency_patience: 1``: the first candidate not faster side by side ends the stage -- and it
    is timed before any accuracy evaluation, so it never becomes a trial (speed first)."""
    timed: list[Point] = []

    def paired(candidate: Point, cflow: Any, reference: Point, rflow: Any) -> dict[str, Any]:
        timed.append(candidate)
        return {"ratio_median": 1.0, "ratio_ci_low": 0.97, "ratio_ci_high": 1.03, "faster": False}

    config = _static_config(make_config, weight_type={"search": ["int8", "uint8"]})
    base = accuracy_problem(config, {"stop_at_ceiling": False, "latency_patience": 1})
    strategy = create_strategy("quantune")
    strategy.bind(dataclasses.replace(base, latency_ratio=_fast, paired_latency=paired))
    strategy.observe_baseline({"latency_ms": 1.0})
    seen = _drive(strategy, _all_meet)
    assert [s for _, s in seen if s.startswith("latency")] == []  # not faster: never evaluated
    assert len(timed) == 1  # compared with the incumbent by paired timing
    assert "not faster" in strategy.finished_reason, strategy.finished_reason


def test_a_faster_candidate_becomes_the_incumbent(make_config) -> None:
    """A candidate faster side by side replaces the incumbent; the next ones are its neighbours."""

    def paired(candidate: Point, cflow: Any, reference: Point, rflow: Any) -> dict[str, Any]:
        faster = candidate.get("static_quant.weight_type") == "uint8" != reference.get("static_quant.weight_type")
        return {"ratio_median": 0.8 if faster else 1.0, "faster": faster}

    config = _static_config(make_config, weight_type={"search": ["int8", "uint8"]})
    base = accuracy_problem(config, {"stop_at_ceiling": False})
    strategy = create_strategy("quantune")
    strategy.bind(dataclasses.replace(base, latency_ratio=_fast, paired_latency=paired))
    strategy.observe_baseline({"latency_ms": 1.0})
    seen = _drive(strategy, _all_meet)
    latency = [p for p, s in seen if s.startswith("latency")]
    after = latency[latency.index(next(p for p in latency if p["static_quant.weight_type"] == "uint8")) + 1 :]
    assert all(p["static_quant.weight_type"] == "uint8" for p in after)


# -- byte-identical graphs are never timed twice ---------------------------------------------------


def test_a_duplicate_model_in_the_latency_stage_is_not_timed(make_config) -> None:
    """A candidate faster side by side whose trial turns out to be an earlier trial's model: the
    earlier timing stands, the duplicate is not timed again after its trial."""
    timed: list[Point] = []

    def paired(candidate: Point, cflow: Any, reference: Point, rflow: Any) -> dict[str, Any]:
        timed.append(candidate)
        return {"ratio_median": 0.9, "faster": True}

    config = _static_config(make_config, weight_type={"search": ["int8", "uint8"]})
    base = accuracy_problem(config, {"stop_at_ceiling": False})
    strategy = create_strategy("quantune")
    strategy.bind(dataclasses.replace(base, latency_ratio=_fast, paired_latency=paired))
    strategy.observe_baseline({"latency_ms": 1.0})
    seen = _drive(strategy, lambda point: dataclasses.replace(_all_meet(point), duplicate_of=0))
    latency = [p for p, s in seen if s.startswith("latency")]
    assert latency, "no latency trial"
    assert len(timed) == len(latency)  # each timed once, before its trial; none after it


def test_the_paired_timing_of_one_pair_of_models_runs_once(make_config, monkeypatch: pytest.MonkeyPatch) -> None:
    """A byte-identical pair is not timed at all; another pair is timed once, then read from the cache."""
    from quantune.config import load_config
    from quantune.engine.measure import paired_timing
    from quantune.engine.measure.probes import variant_builder
    from quantune.engine.trials.setup import build_run

    config = _static_config(make_config)
    parts = build_run(load_config(config))
    calls = []
    real = parts.context.evaluator.backend.time  # the one timing path: the backend's

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(parts.context.evaluator.backend, "time", counting)
    build = variant_builder(parts.context, parts.plan)
    flow = ("static_quant",)
    a = {"static_quant.per_channel": True}
    b = {"static_quant.per_channel": False}
    same = paired_timing.paired_latency(parts.context, (a, flow), (dict(a), flow), build)
    assert same is not None and same["same_model"] and same["rounds"] == 0 and not calls
    first = paired_timing.paired_latency(parts.context, (a, flow), (b, flow), build)
    again = paired_timing.paired_latency(parts.context, (a, flow), (b, flow), build)
    assert first is not None and first["rounds"] >= 5
    assert again == first and len(calls) == 1


def test_a_paired_timing_stops_at_the_runs_limit_without_an_answer(make_config) -> None:
    """Past the run's limit (less its end) no round starts after the first: too few rounds give no
    answer, and none is cached -- the pair is timed in full when asked with time left. A detector's
    paired timing of its two fastest ceilings ran 11 rounds, 4.7 s, past a 60 s limit."""
    import time

    from quantune.config import load_config
    from quantune.engine.measure import paired_timing
    from quantune.engine.measure.probes import variant_builder
    from quantune.engine.trials.setup import build_run

    parts = build_run(load_config(_static_config(make_config)))
    build = variant_builder(parts.context, parts.plan)
    flow = ("static_quant",)
    a, b = {"static_quant.per_channel": True}, {"static_quant.per_channel": False}
    past = time.perf_counter() - 1.0
    assert paired_timing.paired_latency(parts.context, (a, flow), (b, flow), build, limit=past) is None
    timed = paired_timing.paired_latency(parts.context, (a, flow), (b, flow), build)
    assert timed is not None and timed["rounds"] >= paired_timing.MIN_ROUNDS


# -- 3. reproducible ---------------------------------------------------------------------------------


def _layernorm(tmp_path: Path, objective: str) -> dict[str, Any]:
    model = build_layernorm_mlp(tmp_path / "ln.onnx")
    data = layernorm_data(tmp_path, model)
    return {
        "model": str(model),
        "prepare": "off",
        "data": {"calibration": str(data["calibration"]), "evaluation": str(data["evaluation"]), "batch_size": 50},
        "evaluation": {"metric": "top1", "latency": {"warmup": 1, "repeats": 3, "threads": 1}},
        "criterion": {"type": "relative", "tolerable_loss": 0.03},
        "objective": objective,
        "passes": [
            {"name": "static_quant", "search": True, "params": {"quant_format": "QDQ", "activation_type": "uint8"}}
        ],
        "search": {"sampler": "tpe", "seed": 3, "strategy": "quantune", "strategy_options": {"drop_slow": False}},
        "stop": {"max_trials": 12},
        **INLINE_EXECUTOR,
    }


def _trials(result: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(t.stage.split(" -> ")[0], t.params) for t in sorted(result.trials, key=lambda t: t.number)]


@pytest.mark.parametrize("objective", ["size", "latency"])
def test_the_same_run_twice_tries_the_same_trials(tmp_path: Path, objective: str) -> None:
    """Cold cache, same seed: the recovery stages try the same points in the same order; with
    ``objective: size`` nothing rests on timing, so the final model is the same too. In a latency run
    a group put back in int8 stays there only when the model is not slower side by side (a timing):
    the trials are the same up to the first such step, which the second run tries too."""
    runs = []
    for index in range(2):
        config = _layernorm(tmp_path / f"data{index}", objective)
        config["cache_dir"] = str(tmp_path / f"cache{index}")
        runs.append(quantune.tune(config, output=tmp_path / f"run{index}"))
    first, second = (_trials(run) for run in runs)
    recovery = ("ceiling", "op types", "bisect", "prune", "screen")
    one, two = ([t for t in trials if t[0].startswith(recovery)] for trials in (first, second))
    if objective == "latency":
        timed = next((i for i, t in enumerate(one) if t[0].startswith(("op types: +", "prune"))), len(one))
        one, two = one[: timed + 1], two[: timed + 1]
    assert one == two
    assert any(stage.startswith("op types") for stage, _ in first)
    if objective == "size":
        assert first == second
        assert runs[0].best is not None and runs[1].best is not None
        assert runs[0].best.params == runs[1].best.params


def test_ceilings_within_the_noise_go_to_the_earlier_variant(make_config) -> None:
    """Dynamic 0.500x and static QDQ/uint8 0.505x the original are one speed: the earlier built
    (static uint8) is recovered first, whichever the timing noise put ahead."""

    def ratio(point: Point, flow: tuple[str, ...]) -> float:
        if flow == ("dynamic_quant",):
            return 0.5
        key = (point["static_quant.quant_format"], point["static_quant.activation_type"])
        return 0.505 if key == ("QDQ", "uint8") else 0.9

    passes = [{"name": "static_quant", "search": True}, {"name": "dynamic_quant", "search": True}]
    config = make_config(passes, flows=[["static_quant"], ["dynamic_quant"]], search={"strategy": "quantune"})
    strategy = create_strategy("quantune")
    strategy.bind(dataclasses.replace(accuracy_problem(config), latency_ratio=ratio))
    strategy.observe_baseline({"latency_ms": 1.0})
    seen = _drive(strategy, _all_meet)
    assert len(seen) == 1
    point = seen[0][0]
    assert point["flow"] == "static_quant" and point["static_quant.activation_type"] == "uint8"
    assert "nothing faster is possible" in strategy.finished_reason


def test_a_tie_goes_to_the_variant_already_in_budget(tmp_path: Path) -> None:
    """The first guess (dynamic, for a MatMul chain) met the criterion and ties with a static ceiling
    0.01x faster: it is the one recovered in, so the search ends without another evaluation."""

    def ratio(point: Point, flow: tuple[str, ...]) -> float:
        if flow == ("dynamic_quant",):
            return 0.505
        key = (point["static_quant.quant_format"], point["static_quant.activation_type"])
        return 0.5 if key == ("QDQ", "uint8") else 0.9

    config = _matmul_config(tmp_path)
    config["passes"] = [{"name": "static_quant", "search": True}, {"name": "dynamic_quant", "search": True}]
    config["flows"] = [["static_quant"], ["dynamic_quant"]]
    problem = accuracy_problem(config, {"first_guess": True})
    strategy = create_strategy("quantune")
    strategy.bind(dataclasses.replace(problem, latency_ratio=ratio))
    strategy.observe_baseline({"latency_ms": 1.0})
    seen = _drive(strategy, _all_meet)
    assert [stage.split(":")[0] for _, stage in seen] == ["first guess"]
    assert seen[0][0]["flow"] == "dynamic_quant"
    assert "nothing faster is possible" in strategy.finished_reason


@pytest.mark.parametrize("faster", [False, True])
def test_a_near_faster_ceiling_goes_first_only_when_faster_side_by_side(make_config, faster: bool) -> None:
    """QOperator/uint8 0.41x and QDQ/uint8 0.43x by the ceilings' medians: timed side by side, QOperator
    goes first only when it is faster beyond the noise; otherwise the earlier built QDQ does."""

    def ratio(point: Point, flow: tuple[str, ...]) -> float:
        key = (point["static_quant.quant_format"], point["static_quant.activation_type"])
        return {("QOperator", "uint8"): 0.41, ("QDQ", "uint8"): 0.43}.get(key, 0.9)

    def paired(candidate: Point, cflow: Any, reference: Point, rflow: Any) -> dict[str, Any]:
        return {"ratio_median": 0.95, "faster": faster}

    problem = accuracy_problem(_static_config(make_config))
    strategy = create_strategy("quantune")
    strategy.bind(dataclasses.replace(problem, latency_ratio=ratio, paired_latency=paired))
    strategy.observe_baseline({"latency_ms": 1.0})
    seen = _drive(strategy, _all_meet)
    assert len(seen) == 1
    assert seen[0][0]["static_quant.quant_format"] == ("QOperator" if faster else "QDQ")
