"""Search spaces: conditional parameters, constraints, sizes and enumeration, checked against an
independent brute-force enumeration with itertools.product."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from quantune import Boolean, Categorical, Conditional, SearchSpace
from quantune.space import point_key

_INACTIVE = object()


def _domain(param: Any) -> list[Any]:
    if isinstance(param, Conditional):
        values: list[Any] = []
        for choices in param.cases.values():
            values += [value for value in choices if value not in values]
        return values
    return list(param.choices)


def _allowed(param: Any, point: Mapping[str, Any]) -> tuple[Any, ...]:
    """What ``param`` may take given the (active) values in ``point``, read from its definition."""
    if isinstance(param, Conditional):
        if any(parent not in point for parent in param.parents):
            return ()
        return tuple(param.cases.get(tuple(point[parent] for parent in param.parents), ()))
    return tuple(param.choices)


def brute_force(
    params: Mapping[str, Any], constraints: list[Callable[[Mapping[str, Any]], bool]] = ()
) -> tuple[list[dict[str, Any]], int]:
    """(valid points, raw count): every combination of every value (or inactive) per parameter,
    kept when each parameter's value is exactly what its parents allow."""
    names = list(params)
    domains = [[*_domain(params[name]), _INACTIVE] for name in names]
    raw: list[dict[str, Any]] = []
    for combo in itertools.product(*domains):
        point = {name: value for name, value in zip(names, combo, strict=True) if value is not _INACTIVE}
        consistent = True
        for name, value in zip(names, combo, strict=True):
            allowed = _allowed(params[name], point)
            if (value is _INACTIVE and allowed) or (value is not _INACTIVE and value not in allowed):
                consistent = False
                break
        if consistent:
            raw.append(point)
    valid = [point for point in raw if all(rule(point) for rule in constraints)]
    return valid, len(raw)


def quant_like_params() -> dict[str, Any]:
    """Children listed before their parents on purpose; a two-parent conditional; a chain."""
    return {
        "symmetric": Conditional.on("act", {"int8": (False, True)}),
        "deep": Conditional.on("symmetric", {True: (1, 2)}),
        "fmt": Categorical(("QDQ", "QOperator")),
        "act": Categorical(("uint8", "int8", "int16")),
        "method": Categorical(("MinMax", "Entropy", "Percentile")),
        "pct": Conditional.on("method", {"Percentile": (99.9, 99.99, 99.999)}),
        "per_channel": Boolean(),
        "tag": Conditional(("fmt", "per_channel"), {("QDQ", True): ("a", "b"), ("QOperator", False): ("c",)}),
    }


def no_wide_qoperator(point: Mapping[str, Any]) -> bool:
    return not (point["fmt"] == "QOperator" and point["act"] == "int16")


def keys(points) -> list[str]:
    return [point_key(point) for point in points]


def test_raw_size_with_conditionals_equals_brute_force():
    params = quant_like_params()
    _, raw = brute_force(params)
    assert SearchSpace(params).raw_size() == raw
    # Constraints prune points but do not change the raw size.
    assert SearchSpace(params, [no_wide_qoperator]).raw_size() == raw


@pytest.mark.parametrize(
    "params",
    [
        {"a": Categorical((1,))},
        {"a": Categorical((1, 2, 3)), "b": Boolean()},
        {"a": Categorical(("x", "y")), "b": Conditional.on("a", {"z": (1, 2)})},  # never active
        {
            "a": Categorical(("x", "y", "z")),
            "b": Conditional.on("a", {"x": (1, 2), "y": (3,)}),
            "c": Conditional.on("b", {1: ("p", "q", "r"), 3: ("s",)}),
            "d": Conditional(("a", "c"), {("x", "p"): (True, False), ("y", "s"): (None,)}),
        },
    ],
    ids=["single", "product", "inactive", "chain"],
)
def test_raw_size_matches_brute_force_on_various_spaces(params):
    valid, raw = brute_force(params)
    space = SearchSpace(params)
    assert space.raw_size() == raw
    assert sorted(keys(space.iterate())) == sorted(keys(valid))


def test_iterate_yields_every_valid_point_once():
    params = quant_like_params()
    expected, _ = brute_force(params, [no_wide_qoperator])
    produced = list(SearchSpace(params, [no_wide_qoperator]).iterate())
    assert len(produced) == len(set(keys(produced))), "a point was produced twice"
    assert sorted(keys(produced)) == sorted(keys(expected))
    assert all(no_wide_qoperator(point) for point in produced)


def test_inactive_parameters_are_left_out_of_points():
    space = SearchSpace(quant_like_params())
    for point in space.iterate():
        assert ("pct" in point) == (point["method"] == "Percentile")
        assert ("symmetric" in point) == (point["act"] == "int8")
        assert ("deep" in point) == (point.get("symmetric") is True)


def test_parents_are_ordered_before_children():
    names = SearchSpace(quant_like_params()).names
    assert names.index("act") < names.index("symmetric") < names.index("deep")
    assert names.index("method") < names.index("pct")
    assert names.index("fmt") < names.index("tag") and names.index("per_channel") < names.index("tag")


def test_sample_draws_consistent_points():
    params = quant_like_params()
    space = SearchSpace(params)
    raw_points, _ = brute_force(params)
    allowed = set(keys(raw_points))
    rng = random.Random(0)
    drawn = {point_key(space.sample(rng)) for _ in range(300)}
    assert drawn <= allowed
    assert len(drawn) > 1


def test_is_valid_applies_every_constraint():
    space = SearchSpace({"a": Categorical((1, 2, 3))}, [lambda p: p["a"] != 2, lambda p: p["a"] != 3])
    assert [p["a"] for p in space.iterate()] == [1]
    assert space.is_valid({"a": 1}) and not space.is_valid({"a": 3})


@pytest.mark.parametrize(
    "params",
    [
        {"a": Conditional.on("b", {1: (1,)}), "b": Conditional.on("a", {1: (1,)})},
        {"a": Conditional.on("a", {1: (1,)})},
        {
            "a": Conditional.on("c", {1: (1,)}),
            "b": Conditional.on("a", {1: (1,)}),
            "c": Conditional.on("b", {1: (1,)}),
        },
    ],
    ids=["two", "self", "three"],
)
def test_cycles_in_conditionals_raise(params):
    with pytest.raises(ValueError, match="cycle"):
        SearchSpace(params)


def test_conditional_on_missing_parameter_raises():
    with pytest.raises(ValueError, match="missing_parent"):
        SearchSpace({"a": Conditional.on("missing_parent", {1: (1,)})})


def test_parameter_definitions_are_checked():
    with pytest.raises(ValueError):
        Categorical(())
    with pytest.raises(ValueError):
        Conditional((), {})
    with pytest.raises(ValueError):
        Conditional(("a", "b"), {("x",): (1,)})


def test_point_key_is_canonical():
    assert point_key({"a": 1, "b": "x"}) == point_key({"b": "x", "a": 1})
    assert point_key({"a": 1}) != point_key({"a": "1"})
    assert point_key({"a": True}) != point_key({"a": 1})
