"""Accuracy-driven strategies: stage orders, bisection, user constraints, and real runs."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import quantune
from conftest import accuracy_problem
from quantune.config import load_config
from quantune.space import Point
from quantune.strategy import WAIT, Outcome, create_strategy
from quantune.strategy.accuracy import Bisection, minimal_k

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"
SCALED = ROOT / "examples" / "scaled_cnn"
CONV2 = "/features/features.2/Conv"
CONV5 = "/features/features.5/Conv"
STRATEGIES = ["basic", "conservative", "auto", "mse", "mse_v2", "two_stage", "quantune"]


def scaled_config(tmp_path: Path, strategy: str, *, max_trials: int = 12, passes: list | None = None) -> dict:
    """The scaled CNN with per-channel weights off, so only fallback (or CLE) recovers accuracy. The
    ``quantune`` strategy keeps every ceiling whatever its speed (``drop_slow: false``): what these
    tests ask is how accuracy is recovered, and on an AVX2-only EPYC this CNN's int8 runs 0.97x fp32,
    at the speed margin, so a run under load dropped every ceiling and recovered nothing."""
    search: dict[str, Any] = {"sampler": "random", "seed": 0, "strategy": strategy}
    if strategy == "quantune":
        search["strategy_options"] = {"drop_slow": False}
    return {
        "model": str(SCALED / "model.onnx"),
        "data": {
            "calibration": str(DIGITS / "calib.npz"),
            "evaluation": str(DIGITS / "eval.npz"),
            "batch_size": 64,
        },
        "evaluation": {"metric": "top1", "latency": {"warmup": 1, "repeats": 3, "threads": 1}},
        "criterion": {"type": "relative", "tolerable_loss": 0.01},
        "passes": passes or [{"name": "static_quant", "search": True, "params": {"per_channel": False}}],
        "search": search,
        "stop": {"max_trials": max_trials},
        "cache_dir": str(tmp_path / "cache"),
        "executor": {"kind": "inline"},
    }


def needs_both_convs(point: Point) -> Outcome:
    """A fake evaluation: the criterion holds iff both scaled convs stay in fp32."""
    excluded = set(point.get("static_quant.nodes_to_exclude", []))
    meets = {CONV2, CONV5} <= excluded
    return Outcome(1.0 + 0.1 * len(excluded), 0.0 if meets else 0.05, meets, {})


def drive(strategy: Any, judge: Callable[[Point], Outcome], limit: int = 60) -> list[Point]:
    """ask/tell without the engine; returns the proposed points in order."""
    points = []
    for _ in range(limit):
        proposal = strategy.ask()
        if proposal is None:
            break
        assert proposal is not WAIT  # told at once, so never waits
        points.append(proposal.point)
        strategy.tell(proposal, judge(proposal.point))
    return points


def stages_of(strategy: Any) -> list[str]:
    return list(dict.fromkeys(stage.split(":")[0] for stage in strategy.stage_log))


# -- bisection (pure) -------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 5, 17, 64])
def test_bisection_finds_minimal_k_in_log_evaluations(n: int) -> None:
    for answer in range(1, n + 1):
        k, tried = minimal_k(n, lambda k, answer=answer: k >= answer)
        assert k == answer
        assert len(tried) <= 1 + max(1, (n - 1).bit_length())


def test_bisection_reports_none_when_even_full_fallback_misses() -> None:
    k, tried = minimal_k(8, lambda k: False)
    assert k is None and tried == [8]
    assert Bisection(0).next_k() is None


# -- stage orders (fake evaluations, real graph and sensitivity) ------------------------------------

EXPECTED = {
    "basic": [
        "default",
        "op-type-wise tuning",
        "op-type-wise fallback",
        "instance-wise fallback",
        "accumulated fallback",
    ],
    "conservative": ["fp32", "quantize Conv", "quantize Gemm"],
    "auto": [
        "default",
        "fp32",
        "quantize Conv",
        "quantize Gemm",
        "op-type-wise tuning",
        "op-type-wise fallback",  # from the best tuned config: new points
        "instance-wise fallback",
        "accumulated fallback",
    ],
    "mse": ["default", "op-type-wise tuning", "accumulated fallback (by error)"],
    "mse_v2": ["default", "fallback", "revert"],
    "two_stage": ["calibration", "rest"],
    # no latency stage: with per_channel fixed, no searched parameter changes the graph (issue 23)
    "quantune": ["ceiling", "recover targeted", "screen", "bisect", "prune"],
}


@pytest.mark.parametrize("name", STRATEGIES)
def test_stage_order(tmp_path: Path, name: str) -> None:
    strategy = create_strategy(name)
    strategy.bind(accuracy_problem(scaled_config(tmp_path, name, max_trials=30)))
    drive(strategy, needs_both_convs)
    assert stages_of(strategy)[: len(EXPECTED[name])] == EXPECTED[name]


def test_quantune_bisects_to_the_two_scaled_convs(tmp_path: Path) -> None:
    strategy = create_strategy("quantune")
    strategy.bind(accuracy_problem(scaled_config(tmp_path, "quantune", max_trials=30), {"latency_trials": 0}))
    drive(strategy, needs_both_convs)
    bisect = [s for s in strategy.stage_log if s.startswith("bisect")]
    assert len(bisect) <= 4  # 1 + ceil(log2(5 groups))
    assert {g.name for g in strategy.ranking[:2]} == {CONV2, CONV5}  # sensitivity ranks them first
    assert strategy.smallest_meeting_fallback == 2
    best = strategy.best_meeting()
    assert best is not None and best.stage.startswith("bisect: k=2/")
    assert {CONV2, CONV5} <= set(best.point["static_quant.nodes_to_exclude"])


def test_a_bisection_whose_first_miss_wins_back_little_asks_the_top_and_stops(tmp_path: Path) -> None:
    """No fallback of the groups holds (the loss is elsewhere): each group in fp32 wins back a sliver, so after the
    first miss the top is asked at once, and its miss ends the bisection instead of climbing one miss at a time."""
    strategy = create_strategy("quantune")
    strategy.bind(accuracy_problem(scaled_config(tmp_path, "quantune", max_trials=30), {"latency_trials": 0}))

    def hopeless(point: Point) -> Outcome:
        excluded = point.get("static_quant.nodes_to_exclude", [])
        return Outcome(1.0 + 0.1 * len(excluded), 0.05 - 0.0001 * len(excluded), False, {})

    drive(strategy, hopeless)
    ks = [int(s.split("k=")[1].split("/")[0]) for s in strategy.stage_log if s.startswith("bisect")]
    # each variant's bisection: its first k, then the top (the old climb asked k=3 between them)
    assert ks and len(ks) % 2 == 0 and set(ks) == {ks[0], ks[1]} and ks[1] > ks[0] + 1, ks
    assert strategy.best_meeting() is None


def test_user_op_constraints_are_honoured(tmp_path: Path) -> None:
    options = {"fp32_op_types": ["Gemm"], "int8_nodes": [CONV5]}
    strategy = create_strategy("basic")
    strategy.bind(accuracy_problem(scaled_config(tmp_path, "basic", max_trials=30), options))
    points = drive(strategy, needs_both_convs)
    gemms = {"/classifier/classifier.1/Gemm", "/classifier/classifier.3/Gemm"}
    assert points
    for point in points:
        excluded = set(point.get("static_quant.nodes_to_exclude", []))
        assert gemms <= excluded  # always fp32
        assert CONV5 not in excluded  # never falls back


def test_fixed_nodes_to_exclude_stay_excluded(tmp_path: Path) -> None:
    passes = [{"name": "static_quant", "params": {"per_channel": False, "nodes_to_exclude": [CONV2]}}]
    strategy = create_strategy("mse_v2")
    strategy.bind(accuracy_problem(scaled_config(tmp_path, "mse_v2", passes=passes)))
    points = drive(strategy, needs_both_convs)
    assert all(CONV2 in p.get("static_quant.nodes_to_exclude", []) for p in points)


# -- real runs through the engine -----------------------------------------------------------------


@pytest.mark.parametrize("name", STRATEGIES)
def test_every_strategy_completes_on_digits(tmp_path: Path, name: str) -> None:
    config = load_config(DIGITS / "config.yaml").config.model_dump(mode="json")
    config.update(
        model=str(DIGITS / "model.onnx"),
        data={**config["data"], "calibration": str(DIGITS / "calib.npz"), "evaluation": str(DIGITS / "eval.npz")},
        cache_dir=str(tmp_path / "cache"),
    )
    config["evaluation"]["latency"].update(warmup=1, repeats=3)
    config["search"]["strategy"] = name
    if name == "quantune":  # trials whatever int8's speed here (0.97-0.98x fp32 on an AVX2-only EPYC)
        config["search"]["strategy_options"] = {"drop_slow": False}
    config["stop"]["max_trials"] = 4
    config["executor"] = {"kind": "inline"}
    result = quantune.tune(config, output=tmp_path / "run")
    spent = [t for t in result.trials if "duplicate of trial" not in t.stage]  # a repeated model is no trial
    assert 1 <= len(spent) <= 4
    assert all(trial.status == "ok" for trial in result.trials)
    assert result.best is not None or result.closest_miss is not None


@pytest.mark.parametrize("name", ["quantune", "auto"])
def test_scaled_cnn_meets_the_budget(tmp_path: Path, name: str) -> None:
    started = time.perf_counter()
    result = quantune.tune(scaled_config(tmp_path, name, max_trials=14), output=tmp_path / "run")
    assert result.best is not None, "no model met the budget"
    first = min(t.number for t in result.trials if t.meets_criterion)
    print(f"{name}: first meeting model after {first + 1} evaluations, {time.perf_counter() - started:.1f} s")
    # a meeting model is a quantized one, not the 12 quantizable nodes all kept in fp32; how many
    # stay in fp32 depends on the path, which depends on measured latency (7 to 9 seen here)
    sizes = [len(t.params.get("static_quant.nodes_to_exclude", [])) for t in result.trials if t.meets_criterion]
    assert min(sizes) < 12


def test_cle_keeps_the_scaled_cnn_all_int8(tmp_path: Path) -> None:
    passes = [{"name": "cle"}, {"name": "static_quant", "search": True, "params": {"per_channel": False}}]
    result = quantune.tune(scaled_config(tmp_path, "quantune", max_trials=3, passes=passes), output=tmp_path / "run")
    assert result.trials[0].stage.startswith("ceiling: cle>static_quant") and result.trials[0].meets_criterion
    assert "static_quant.nodes_to_exclude" not in result.best.params


def test_stage_texts_name_units_by_their_last_two_module_names() -> None:
    """``/erb_conv1/1/Conv`` once read "1" in a stage's text; the module path's last two names say which."""
    from quantune.strategy.accuracy.context import describe

    assert describe(["/model.22/dfl/conv/Conv", "/erb_conv1/1/Conv", "Conv.3"]) == "[dfl/conv, erb_conv1/1, Conv.3]"
    assert describe([f"Conv.{i}" for i in range(6)], limit=2) == "[Conv.0, Conv.1, ...]"
