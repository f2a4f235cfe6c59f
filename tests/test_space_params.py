"""Rich search parameters: integer and float ranges, joint (coupled) values, weights, conditionals
with several parents, and exact sizes of huge spaces, each checked against an independent count."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections import Counter

import pytest

from quantune import QuantuneError
from quantune.search import ExhaustiveSampler, RandomSampler
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


def drain(sampler, space: SearchSpace, limit: int = 100_000) -> list[dict]:
    sampler.bind(space)
    points = []
    while len(points) < limit and (point := sampler.ask()) is not None:
        points.append(point)
    return points


# --- ranges ---------------------------------------------------------------------------------


def test_int_range_with_step_lists_its_grid():
    grid = IntRange(8, 64, step=8)
    assert list(grid.visit_order()) == [8, 16, 24, 32, 40, 48, 56, 64]
    assert grid.size == 8
    uneven = IntRange(0, 10, step=3)
    assert list(uneven.visit_order()) == [0, 3, 6, 9] and uneven.size == 4 and uneven.last == 9
    assert SearchSpace({"n": uneven, "b": Boolean()}).raw_size() == 8


def test_int_range_draws_stay_on_the_grid_and_in_bounds():
    grid = IntRange(-5, 20, step=5)
    rng = random.Random(1)
    draws = [grid.draw(rng) for _ in range(500)]
    assert set(draws) == {-5, 0, 5, 10, 15, 20}
    assert all(isinstance(value, int) for value in draws)


def test_int_range_log_draws_are_log_uniform():
    grid = IntRange(1, 10_000, log=True)
    rng = random.Random(0)
    draws = [grid.draw(rng) for _ in range(2000)]
    assert min(draws) >= 1 and max(draws) <= 10_000
    # Log-uniform over [1, 10^4]: the median is near 10^2; uniform would put it near 5000.
    assert 30 < statistics.median(draws) < 300


def test_float_range_with_step_is_a_decimal_grid():
    grid = FloatRange(0.1, 0.5, step=0.1)
    assert list(grid.visit_order()) == [0.1, 0.2, 0.3, 0.4, 0.5]  # 0.3, not 0.30000000000000004
    assert grid.size == 5 and grid.finite
    assert grid.snap(0.30000000000000004) == 0.3 and grid.snap(7.0) == 0.5
    assert SearchSpace({"x": grid}).raw_size() == 5


def test_float_range_log_draws_are_log_uniform_and_in_bounds():
    grid = FloatRange(1e-6, 1e-2, log=True)
    rng = random.Random(0)
    draws = [grid.draw(rng) for _ in range(2000)]
    assert all(1e-6 <= value <= 1e-2 for value in draws)
    assert 1e-5 < statistics.median(draws) < 1e-3  # geometric middle is 1e-4
    assert not grid.finite and grid.size == math.inf


def test_continuous_space_has_infinite_size_and_cannot_be_enumerated():
    space = SearchSpace({"lr": FloatRange(1e-5, 1e-1, log=True), "b": Boolean()})
    assert space.raw_size() == math.inf
    assert space.continuous_params() == ["lr"] and not space.is_finite()
    with pytest.raises(QuantuneError, match="continuous"):
        space.iterate()
    with pytest.raises(QuantuneError, match=r"exhaustive.*\['lr'\]"):
        ExhaustiveSampler().bind(space)


def test_random_sampler_draws_continuous_values_without_repeating():
    space = SearchSpace({"lr": FloatRange(0.0, 1.0), "n": IntRange(1, 3)})
    points = drain(RandomSampler(seed=3), space, limit=300)
    assert len(points) == 300 == len({point_key(p) for p in points})
    assert all(0.0 <= p["lr"] <= 1.0 and p["n"] in (1, 2, 3) for p in points)


@pytest.mark.parametrize(
    "make",
    [
        lambda: IntRange(5, 1),
        lambda: IntRange(0, 10, step=0),
        lambda: IntRange(0, 10, log=True),
        lambda: IntRange(1, 10, step=2, log=True),
        lambda: FloatRange(1.0, 1.0),
        lambda: FloatRange(0.0, 1.0, step=-0.1),
        lambda: FloatRange(0.0, 1.0, log=True),
        lambda: FloatRange(0.1, 1.0, step=0.1, log=True),
    ],
)
def test_bad_ranges_are_rejected(make):
    with pytest.raises(ValueError):
        make()


def test_ranges_reject_non_numbers():
    with pytest.raises(TypeError):
        IntRange(0, True)
    with pytest.raises(TypeError):
        FloatRange(0.0, math.inf)


def test_a_continuous_parent_is_rejected():
    with pytest.raises(ValueError, match="continuous"):
        SearchSpace({"x": FloatRange(0.0, 1.0), "y": Conditional.on("x", {0.5: (1,)})})


# --- joint parameters -----------------------------------------------------------------------

SCHEDULE = Joint(("iterations", "lr"), [(100, 1e-4), (200, 1e-5), (400, 1e-6)])


def test_joint_values_stay_coupled_in_every_point():
    space = SearchSpace({"schedule": SCHEDULE, "per_channel": Boolean()})
    assert space.raw_size() == 6
    drawn = [space.sample(random.Random(seed)) for seed in range(200)]
    for point in [*space.iterate(), *drawn]:
        assert point["schedule"] in SCHEDULE.values


def test_expand_joint_gives_the_individual_names():
    space = SearchSpace({"schedule": SCHEDULE, "per_channel": Boolean()})
    point = {"schedule": (200, 1e-5), "per_channel": True}
    assert space.expand(point) == {"iterations": 200, "lr": 1e-5, "per_channel": True}
    for point in space.iterate():
        expanded = space.expand(point)
        assert (expanded["iterations"], expanded["lr"]) == point["schedule"]
        assert "schedule" not in expanded


def test_joint_inside_a_conditional_expands_when_active():
    space = SearchSpace(
        {
            "optimizer": Categorical(("adam", "sgd")),
            "schedule": Conditional.on("optimizer", {"adam": SCHEDULE}),
        }
    )
    points = list(space.iterate())
    assert len(points) == 4
    assert space.expand({"optimizer": "adam", "schedule": (400, 1e-6)}) == {
        "optimizer": "adam",
        "iterations": 400,
        "lr": 1e-6,
    }
    assert space.expand({"optimizer": "sgd"}) == {"optimizer": "sgd"}


def test_joint_names_must_not_clash():
    with pytest.raises(ValueError, match="lr"):
        SearchSpace({"schedule": SCHEDULE, "lr": Categorical((0.1,))})
    with pytest.raises(ValueError, match="iterations"):
        SearchSpace({"a": SCHEDULE, "b": Joint(("iterations", "warmup"), [(1, 2)])})
    with pytest.raises(ValueError):
        Joint(("a", "b"), [(1, 2, 3)])
    with pytest.raises(ValueError):
        Joint(("a", "a"), [(1, 2)])


# --- weights --------------------------------------------------------------------------------


def test_weights_bias_random_sampling():
    method = Categorical(("MinMax", "Entropy", "Percentile"), weights=(1, 6, 3))
    rng = random.Random(0)
    counts = Counter(method.draw(rng) for _ in range(2000))
    assert counts.most_common(1)[0][0] == "Entropy"
    assert counts["Entropy"] > counts["Percentile"] > counts["MinMax"]
    assert abs(counts["Entropy"] / 2000 - 0.6) < 0.05


def test_weights_bias_the_random_sampler_over_a_space():
    space = SearchSpace({"method": Categorical(("a", "b", "c"), weights=(1, 1, 8)), "n": IntRange(0, 10_000)})
    points = drain(RandomSampler(seed=0), space, limit=2000)
    counts = Counter(point["method"] for point in points)
    assert counts.most_common(1)[0][0] == "c" and counts["c"] > 1400


def test_exhaustive_visits_higher_weights_first():
    method = Categorical(("MinMax", "Entropy", "Percentile"), weights=(1, 6, 3))
    assert method.visit_order() == ("Entropy", "Percentile", "MinMax")
    assert method.choices == ("MinMax", "Entropy", "Percentile")  # declared order kept
    space = SearchSpace({"method": method, "per_channel": Boolean(weights=(1, 2))})
    order = [(p["method"], p["per_channel"]) for p in drain(ExhaustiveSampler(), space)]
    assert order == [
        ("Entropy", True),
        ("Entropy", False),
        ("Percentile", True),
        ("Percentile", False),
        ("MinMax", True),
        ("MinMax", False),
    ]


def test_equal_weights_keep_the_declared_order():
    assert Categorical(("x", "y", "z"), weights=(2, 5, 2)).visit_order() == ("y", "x", "z")


@pytest.mark.parametrize("weights", [(1, 2), (1, 0, 1), (1, -1, 1), (1, math.nan, 1)])
def test_bad_weights_are_rejected(weights):
    with pytest.raises(ValueError, match="weight"):
        Categorical(("a", "b", "c"), weights=weights)


# --- conditionals ---------------------------------------------------------------------------


def test_children_are_sampled_after_their_parents():
    # Declared child-first on purpose; the space reorders, and sampling sees the parent's value.
    space = SearchSpace(
        {
            "percentile": Conditional.on("method", {"Percentile": FloatRange(99.0, 99.999)}),
            "method": Categorical(("MinMax", "Percentile")),
        }
    )
    assert space.names == ["method", "percentile"]
    rng = random.Random(0)
    for _ in range(200):
        point = space.sample(rng)
        assert list(point) == (["method", "percentile"] if point["method"] == "Percentile" else ["method"])
        if "percentile" in point:
            assert 99.0 <= point["percentile"] <= 99.999


def test_conditional_is_inactive_when_the_parent_value_has_no_case():
    space = SearchSpace(
        {"act": Categorical(("uint8", "int8", "int16")), "sym": Conditional.on("act", {"int8": (False, True)})}
    )
    points = list(space.iterate())
    assert [p for p in points if "sym" in p] == [{"act": "int8", "sym": False}, {"act": "int8", "sym": True}]
    assert {"act": "uint8"} in points and {"act": "int16"} in points
    assert space.raw_size() == 4


def test_multi_parent_conditional_counts_and_enumerates_exactly():
    params = {
        "fmt": Categorical(("QDQ", "QOperator")),
        "act": Categorical(("uint8", "int8")),
        "per_channel": Boolean(),
        "tag": Conditional(
            ("fmt", "act", "per_channel"),
            {("QDQ", "int8", True): ("a", "b", "c"), ("QOperator", "uint8", False): IntRange(1, 4)},
        ),
    }
    space = SearchSpace(params)
    # Independent count: 8 parent combinations, two of which carry 3 and 4 values.
    assert space.raw_size() == 6 + 3 + 4
    points = list(space.iterate())
    assert len(points) == 13 == len({point_key(p) for p in points})
    assert {p["tag"] for p in points if "tag" in p} == {"a", "b", "c", 1, 2, 3, 4}


def test_conditional_with_a_fixed_parent_outside_the_space():
    params = {"sym": Conditional.on("act", {"int8": (False, True)}), "b": Boolean()}
    assert SearchSpace(params, fixed={"act": "int8"}).raw_size() == 4
    assert SearchSpace(params, fixed={"act": "uint8"}).raw_size() == 2
    points = list(SearchSpace(params, fixed={"act": "int8"}).iterate())
    assert all("act" not in p and "sym" in p for p in points)


def test_cycles_and_missing_parents_are_rejected():
    with pytest.raises(ValueError, match="cycle"):
        SearchSpace(
            {"a": Conditional(("b", "c"), {(1, 1): (1,)}), "b": Categorical((1,)), "c": Conditional.on("a", {1: (1,)})}
        )
    with pytest.raises(ValueError, match="not in the space"):
        SearchSpace({"a": Conditional(("b", "nowhere"), {(1, 1): (1,)}), "b": Categorical((1,))})


# --- exhaustive enumeration, sizes ----------------------------------------------------------


def brute_force(space_params: dict, rule) -> set[str]:
    """Valid points from the full product of declared values, each parameter kept only where its
    parents allow it (written against the declarations, not the space's own walk)."""
    fmt_values, act_values, n_values = ("QDQ", "QOperator"), ("uint8", "int8", "int16"), (1, 2, 3)
    found = set()
    for fmt, act, n, sym, pct in itertools.product(
        fmt_values, act_values, n_values, (None, False, True), (None, 0.5, 0.75, 1.0)
    ):
        if (sym is None) != (act != "int8"):
            continue
        if (pct is None) != (fmt != "QDQ" or n == 3):
            continue
        point = {"fmt": fmt, "act": act, "n": n}
        if sym is not None:
            point["sym"] = sym
        if pct is not None:
            point["pct"] = pct
        if rule(point):
            found.add(point_key(point))
    return found


def test_exhaustive_visits_each_valid_point_exactly_once():
    params = {
        "pct": Conditional(("fmt", "n"), {("QDQ", 1): FloatRange(0.5, 1.0, step=0.25), ("QDQ", 2): (0.5, 1.0, 0.75)}),
        "sym": Conditional.on("act", {"int8": (False, True)}),
        "fmt": Categorical(("QDQ", "QOperator"), weights=(1, 2)),
        "act": Categorical(("uint8", "int8", "int16")),
        "n": IntRange(1, 3),
    }

    def rule(point) -> bool:
        return not (point["fmt"] == "QOperator" and point["act"] == "int16")

    points = drain(ExhaustiveSampler(), SearchSpace(params, [rule]))
    keys = [point_key(p) for p in points]
    assert len(keys) == len(set(keys))
    assert set(keys) == brute_force(params, rule)
    assert SearchSpace(params).raw_size() == len(brute_force(params, lambda p: True))


def test_raw_size_of_a_huge_space_is_exact_and_enumeration_is_lazy():
    params = {f"p{i}": Categorical(tuple(range(10))) for i in range(12)}
    params["percentile"] = Conditional.on("p0", {value: (99.9, 99.99, 99.999) for value in range(5)})
    params["samples"] = IntRange(16, 4096, step=16)
    params["alpha"] = FloatRange(0.0, 1.0, step=0.01)
    space = SearchSpace(params)
    # p0 with a case: 5 values x 3 percentiles; p0 without: 5 values; 11 more ten-way choices.
    expected = (5 * 3 + 5) * 10**11 * 256 * 101
    assert space.raw_size() == expected > 10**12
    first = next(space.iterate())
    assert first["p0"] == 0 and first["percentile"] == 99.9


def test_raw_size_with_many_independent_conditionals():
    # 300 parents whose value v opens a child with v + 1 values: each pair has 1 + 2 + ... + 10 = 55 points.
    params = {}
    for i in range(300):
        params[f"a{i}"] = Categorical(tuple(range(10)))
        params[f"b{i}"] = Conditional.on(f"a{i}", {v: tuple(range(v + 1)) for v in range(10)})
    assert SearchSpace(params).raw_size() == 55**300


def test_raw_size_with_parents_shared_across_the_space():
    # The same parent steers a child early and late: its value must be remembered in between.
    params = {
        "mode": Categorical(("a", "b", "c")),
        "x": Conditional.on("mode", {"a": (1, 2)}),
        **{f"mid{i}": Boolean() for i in range(30)},
        "y": Conditional(("mode", "x"), {("a", 1): (1, 2, 3), ("b", None): (4,)}),
        "z": Conditional.on("mode", {"c": IntRange(0, 9)}),
    }
    # mode=a: x=1 -> y 3 values, x=2 -> y inactive => 4; mode=b: x inactive, y inactive (no x) => 1; mode=c: 10.
    assert SearchSpace(params).raw_size() == (4 + 1 + 10) * 2**30
