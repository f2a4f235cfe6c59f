"""Every sampler through its ask/tell interface, with real Optuna: seeded reproducibility, ranges
as numbers, joint values kept together, weights, constraints, several objectives, plugins."""

from __future__ import annotations

import importlib.util
import math
import sys
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from quantune import QuantuneError
from quantune.search import Feedback, create_sampler, register_sampler, sampler_names
from quantune.search.base import Sampler
from quantune.space import (
    Boolean,
    Categorical,
    Conditional,
    FloatRange,
    IntRange,
    Joint,
    SearchSpace,
    point_key,
)

HAS_CMAES = importlib.util.find_spec("cmaes") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_cmaes = pytest.mark.skipif(not HAS_CMAES, reason="the 'cmaes' package is not installed")
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (GPSampler needs it)")

SCHEDULE = Joint(("iterations", "lr"), [(100, 1e-3), (200, 1e-4), (400, 1e-5)])


def mixed_space() -> SearchSpace:
    """Every kind of parameter, a two-parent conditional and a rule that prunes some points."""
    params = {
        "fmt": Categorical(("QDQ", "QOperator")),
        "method": Categorical(("MinMax", "Entropy", "Percentile")),
        "pct": Conditional.on("method", {"Percentile": FloatRange(99.0, 99.999)}),
        "sym": Conditional(("fmt", "method"), {("QDQ", "MinMax"): Boolean()}),
        "samples": IntRange(16, 512, step=16),
        "alpha": FloatRange(0.05, 0.95, step=0.05),
        "scale": FloatRange(1e-4, 1.0, log=True),
        "schedule": SCHEDULE,
    }
    return SearchSpace(params, [lambda p: not (p["fmt"] == "QOperator" and p["samples"] > 480)])


def finite_space(alpha: bool = True) -> SearchSpace:
    """162 points before the rule, 135 after; 54 and 45 without ``alpha``."""
    params: dict[str, Any] = {
        "fmt": Categorical(("QDQ", "QOperator")),
        "method": Categorical(("MinMax", "Percentile")),
        "pct": Conditional.on("method", {"Percentile": (99.9, 99.99)}),
        "samples": IntRange(1, 3),
        "schedule": SCHEDULE,
    }
    if alpha:
        params["alpha"] = FloatRange(0.1, 0.3, step=0.1)
    return SearchSpace(params, [lambda p: not (p["fmt"] == "QOperator" and p["samples"] == 3)])


def score(point: Mapping[str, Any]) -> Feedback:
    """A deterministic objective (no model work), so that learning samplers are told the same thing."""
    value = point["samples"] / 100 + point.get("alpha", 0) + (0.5 if point["fmt"] == "QDQ" else 0)
    return Feedback(value, violation=0.2 if point["method"] == "MinMax" else 0.0)


def drive(
    name: str,
    space: SearchSpace,
    n: int,
    *,
    seed: int = 0,
    feedback: Callable[[Mapping[str, Any]], Feedback] = score,
    **options: Any,
) -> list[dict[str, Any]]:
    sampler = create_sampler(name, seed=seed, **options)
    sampler.bind(space)
    points = []
    while len(points) < n and (point := sampler.ask()) is not None:
        points.append(point)
        sampler.tell(point, feedback(point))
    return points


def check_point(point: Mapping[str, Any], space: SearchSpace) -> None:
    assert space.is_valid(point)
    assert set(point) == {name for name in space.names if space.domain_at(name, point) is not None}
    assert point["schedule"] in SCHEDULE.values
    samples = point["samples"]
    assert isinstance(samples, int) and samples in space.params["samples"].visit_order()
    assert point["alpha"] in space.params["alpha"].visit_order()
    if "scale" in point:
        assert 1e-4 <= point["scale"] <= 1.0
    if "pct" in point:
        assert point["method"] == "Percentile" and 99.0 <= point["pct"] <= 99.999


OPTUNA_SAMPLERS = [
    "tpe",
    pytest.param("cmaes", marks=needs_cmaes),
    "qmc",
    "nsga2",
    pytest.param("gp", marks=needs_torch),
]


@pytest.mark.parametrize("name", ["random", *OPTUNA_SAMPLERS])
def test_same_seed_same_feedback_same_points(name):
    first = drive(name, mixed_space(), 25, seed=7)
    again = drive(name, mixed_space(), 25, seed=7)
    assert [point_key(p) for p in first] == [point_key(p) for p in again]
    assert len(first) == 25 == len({point_key(p) for p in first}), "a point was proposed twice"
    for point in first:
        check_point(point, mixed_space())


@pytest.mark.parametrize("name", ["random", "tpe", "qmc", "nsga2"])
def test_another_seed_explores_differently(name):
    assert [point_key(p) for p in drive(name, mixed_space(), 10, seed=1)] != [
        point_key(p) for p in drive(name, mixed_space(), 10, seed=2)
    ]


def test_exhaustive_is_reproducible_and_complete():
    first = drive("exhaustive", finite_space(), 10_000)
    assert [point_key(p) for p in first] == [point_key(p) for p in drive("exhaustive", finite_space(), 10_000)]
    assert len(first) == len({point_key(p) for p in first}) == sum(1 for _ in finite_space().iterate())


@pytest.mark.parametrize("name", ["random", "tpe", "qmc", "nsga2", pytest.param("cmaes", marks=needs_cmaes)])
def test_samplers_visit_every_valid_point_of_a_small_space_then_stop(name):
    space = finite_space(alpha=False)
    expected = {point_key(p) for p in space.iterate()}
    points = drive(name, space, 1000)
    assert [point_key(p) for p in points if point_key(p) not in expected] == []
    assert len(points) == len(expected) == len({point_key(p) for p in points})


def test_stepped_floats_are_the_same_values_from_every_sampler():
    space = SearchSpace({"alpha": FloatRange(0.1, 0.9, step=0.1)})
    grid = set(space.params["alpha"].visit_order())
    for name in ["random", "tpe", "qmc", "nsga2", "exhaustive"]:
        values = {p["alpha"] for p in drive(name, space, 100, feedback=lambda p: Feedback(p["alpha"]))}
        assert values == grid == {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9}


@needs_cmaes
def test_cmaes_searches_numeric_ranges_and_leaves_categoricals_to_random():
    space = SearchSpace(
        {"n": IntRange(1, 64), "x": FloatRange(-2.0, 2.0), "y": FloatRange(1e-3, 10.0, log=True), "fmt": Boolean()}
    )
    points = drive(
        "cmaes",
        space,
        60,
        feedback=lambda p: Feedback((p["x"] - 1.0) ** 2 + (math.log10(p["y"])) ** 2 + abs(p["n"] - 40) / 40),
    )
    assert len(points) == 60
    assert all(isinstance(p["n"], int) and 1 <= p["n"] <= 64 and -2 <= p["x"] <= 2 for p in points)
    early = sum(abs(p["x"] - 1.0) for p in points[:15]) / 15
    late = sum(abs(p["x"] - 1.0) for p in points[-15:]) / 15
    assert late < early, "CMA-ES should move towards the optimum"
    assert {p["fmt"] for p in points} == {False, True}


def test_nsga2_with_two_objectives_runs():
    directions = ("minimize", "minimize")
    sampler = create_sampler("nsga2", seed=0, directions=directions, population_size=8)
    space = mixed_space()
    sampler.bind(space)
    for _ in range(30):
        point = sampler.ask()
        assert point is not None
        latency = point["samples"] / 100 + (0.5 if point["fmt"] == "QDQ" else 0.0)
        size = 1.0 / point["samples"] + point["alpha"]
        sampler.tell(point, Feedback(latency, objectives=(latency, size)))
    study = sampler.study
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(complete) == 30 and all(len(t.values) == 2 for t in complete)
    assert study.best_trials


def test_multi_objective_feedback_must_match_the_directions():
    sampler = create_sampler("tpe", seed=0, directions=["minimize", "maximize"])
    sampler.bind(finite_space())
    point = sampler.ask()
    with pytest.raises(ValueError, match="2 objective"):
        sampler.tell(point, Feedback(1.0))
    sampler.tell(point, Feedback(None, objectives=(1.0, 2.0)))


def test_single_objective_feedback_keeps_working():
    assert Feedback(1.5).values() == (1.5,) and not Feedback(1.5).failed
    assert Feedback(None).failed and Feedback(None).values() is None
    assert Feedback(None, objectives=(1, 2)).values() == (1.0, 2.0)
    assert Feedback(math.nan).values() is None


@needs_cmaes
def test_cmaes_refuses_several_objectives():
    with pytest.raises(QuantuneError, match="one objective"):
        create_sampler("cmaes", directions=["minimize", "minimize"])


def test_bad_directions_are_a_quantune_error():
    with pytest.raises(QuantuneError, match="directions"):
        create_sampler("nsga2", directions=["fastest"])


@pytest.mark.skipif(HAS_TORCH, reason="torch is installed: the missing-torch message cannot be seen")
def test_gp_without_torch_names_the_extra():
    with pytest.raises(QuantuneError, match=r"quantune\[gp\]"):
        create_sampler("gp")


@pytest.mark.parametrize("name", ["tpe", "qmc", "nsga2"])
def test_optuna_samplers_start_with_the_highest_priority_point(name):
    space = SearchSpace(
        {
            "method": Categorical(("MinMax", "Entropy", "Percentile"), weights=(1, 1, 5)),
            "pct": Conditional.on("method", {"Percentile": Categorical((99.9, 99.99, 99.999), weights=(1, 9, 1))}),
            "schedule": Joint(SCHEDULE.names, SCHEDULE.values, weights=(1, 1, 4)),
            "n": IntRange(1, 100),
        }
    )
    first = drive(name, space, 1, feedback=lambda p: Feedback(p["n"]))[0]
    assert (first["method"], first["pct"], first["schedule"]) == ("Percentile", 99.99, (400, 1e-5))


def test_the_highest_priority_value_is_told_apart_from_an_equal_one_of_another_type():
    # 1 == True in Python; the first point must still be the heavier value, True, not 1
    space = SearchSpace({"x": Categorical((1, True), weights=(1, 3)), "n": IntRange(1, 100)})
    first = drive("tpe", space, 1, feedback=lambda p: Feedback(p["n"]))[0]
    assert first["x"] is True


def test_tpe_leaves_inactive_conditionals_out():
    points = drive("tpe", mixed_space(), 30)
    assert any("pct" in p for p in points) and any("pct" not in p for p in points)
    for point in points:
        assert ("sym" in point) == (point["fmt"] == "QDQ" and point["method"] == "MinMax")


# --- registry -------------------------------------------------------------------------------


def test_every_builtin_sampler_is_registered():
    assert {"exhaustive", "random", "tpe", "cmaes", "gp", "qmc", "nsga2"} <= set(sampler_names())


def test_a_decorated_sampler_is_found_by_name():
    @register_sampler("test-always-first")
    class AlwaysFirst(Sampler):
        def ask(self):
            return next(self._require_space().iterate())

    sampler = create_sampler("test-always-first", seed=3)
    assert isinstance(sampler, AlwaysFirst) and sampler.seed == 3


def _install_plugin(tmp_path, monkeypatch, name: str, target: str, module_source: str) -> None:
    """A real installed distribution (a dist-info folder on sys.path) declaring a sampler entry point."""
    module = target.split(":")[0]
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(module_source))
    dist = tmp_path / f"{module}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[quantune.samplers]\n{name} = {target}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)


def test_a_plugin_sampler_is_found_through_its_entry_point(tmp_path, monkeypatch):
    _install_plugin(
        tmp_path,
        monkeypatch,
        "test-plugin-last",
        "quantune_test_plugin:LastSampler",
        """
        from quantune.search import Sampler

        class LastSampler(Sampler):
            def ask(self):
                return None
        """,
    )
    assert "test-plugin-last" in sampler_names()
    assert "quantune_test_plugin" not in sys.modules, "listing names must not import plugins"
    sampler = create_sampler("test-plugin-last", seed=5)
    assert type(sampler).__name__ == "LastSampler" and sampler.seed == 5


def test_a_broken_plugin_is_a_quantune_error(tmp_path, monkeypatch):
    _install_plugin(
        tmp_path, monkeypatch, "test-plugin-broken", "quantune_test_broken:Nope", "raise ImportError('boom')\n"
    )
    with pytest.raises(QuantuneError, match=r"test-plugin-broken.*boom"):
        create_sampler("test-plugin-broken")


def test_an_unknown_sampler_lists_the_known_ones():
    with pytest.raises(QuantuneError, match=r"unknown sampler 'nope'.*nsga2"):
        create_sampler("nope")
