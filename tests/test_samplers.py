"""Samplers through their ask/tell interface: exhaustive, random and Optuna's TPE."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

import quantune
from quantune import Boolean, Categorical, Conditional, Feedback, SearchSpace, create_sampler
from quantune.space import point_key
from test_space import brute_force, keys, no_wide_qoperator, quant_like_params


def constrained_space() -> SearchSpace:
    return SearchSpace(quant_like_params(), [no_wide_qoperator])


def small_constrained_space() -> SearchSpace:
    params = {
        "a": Categorical(("x", "y", "z")),
        "b": Conditional.on("a", {"x": (1, 2), "y": (3,)}),
        "c": Boolean(),
        "d": Conditional(("a", "c"), {("x", True): ("p", "q"), ("z", False): ("r",)}),
    }
    return SearchSpace(params, [lambda p: not (p["a"] == "y" and p["c"])])


def toy_objective(point: Mapping[str, Any]) -> float:
    """A deterministic score so that samplers that learn are told the same thing every time."""
    return float(len(point_key(point)) % 7) + 0.1 * len(point)


def drive(
    name: str,
    space: SearchSpace,
    *,
    seed: int = 0,
    limit: int = 10_000,
    score: Callable[[Mapping[str, Any]], Feedback] | None = None,
) -> list[dict[str, Any]]:
    """Asks until the sampler returns None (or ``limit`` points), telling each point its score."""
    sampler = create_sampler(name, seed=seed)
    sampler.bind(space)
    points: list[dict[str, Any]] = []
    while len(points) < limit:
        point = sampler.ask()
        if point is None:
            break
        points.append(point)
        sampler.tell(point, score(point) if score else Feedback(toy_objective(point)))
    return points


def test_registry_lists_builtin_samplers():
    assert {"exhaustive", "random", "tpe"} <= set(quantune.sampler_names())


def test_unknown_sampler_is_a_quantune_error():
    with pytest.raises(quantune.QuantuneError, match="bogus"):
        create_sampler("bogus")


def test_ask_before_bind_raises():
    with pytest.raises(RuntimeError):
        create_sampler("exhaustive").ask()


# -- exhaustive -----------------------------------------------------------------------------------


def test_exhaustive_visits_every_valid_point_exactly_once():
    space = constrained_space()
    expected, _ = brute_force(quant_like_params(), [no_wide_qoperator])
    visited = drive("exhaustive", space)
    assert len(visited) == len(expected)
    assert len(set(keys(visited))) == len(visited)
    assert sorted(keys(visited)) == sorted(keys(expected))


def test_exhaustive_returns_none_once_done():
    sampler = create_sampler("exhaustive")
    sampler.bind(SearchSpace({"a": Categorical((1, 2))}))
    assert [sampler.ask(), sampler.ask()] == [{"a": 1}, {"a": 2}]
    assert sampler.ask() is None
    assert sampler.ask() is None


def test_exhaustive_over_an_empty_space_proposes_the_defaults_once():
    assert drive("exhaustive", SearchSpace({})) == [{}]


# -- random ---------------------------------------------------------------------------------------


def test_random_is_reproducible_with_a_seed():
    first = drive("random", constrained_space(), seed=11, limit=40)
    second = drive("random", constrained_space(), seed=11, limit=40)
    assert keys(first) == keys(second)


def test_random_differs_across_seeds():
    first = drive("random", constrained_space(), seed=1, limit=40)
    second = drive("random", constrained_space(), seed=2, limit=40)
    assert keys(first) != keys(second)


def test_random_never_repeats_respects_constraints_and_ends_with_none():
    space = constrained_space()
    expected, _ = brute_force(quant_like_params(), [no_wide_qoperator])
    sampler = create_sampler("random", seed=5)
    sampler.bind(space)
    visited = []
    while (point := sampler.ask()) is not None:
        visited.append(point)
        assert len(visited) <= len(expected), "random proposed more points than the space holds"
    assert len(set(keys(visited))) == len(visited)
    assert sorted(keys(visited)) == sorted(keys(expected))
    assert sampler.ask() is None


def test_random_on_a_space_with_no_valid_point_returns_none():
    space = SearchSpace({"a": Categorical((1, 2))}, [lambda p: False])
    assert drive("random", space) == []


# -- TPE ------------------------------------------------------------------------------------------


def test_tpe_seeded_runs_are_reproducible_when_told_the_same_values():
    first = drive("tpe", constrained_space(), seed=3, limit=15)
    second = drive("tpe", constrained_space(), seed=3, limit=15)
    assert len(first) == 15
    assert keys(first) == keys(second)


def test_tpe_proposes_no_duplicates_and_respects_constraints():
    space = constrained_space()
    valid = set(keys(brute_force(quant_like_params(), [no_wide_qoperator])[0]))
    points = drive("tpe", space, seed=0, limit=25)
    assert len(points) == 25
    assert len(set(keys(points))) == len(points)
    assert set(keys(points)) <= valid


def test_tpe_learns_from_feedback_with_failures_and_violations():
    """Failed points (objective None) and criterion misses (violation > 0) are accepted."""

    def score(point):
        if point["method"] == "Entropy":
            return Feedback(None)
        return Feedback(toy_objective(point), violation=0.5 if point["fmt"] == "QOperator" else 0.0)

    points = drive("tpe", constrained_space(), seed=0, limit=20, score=score)
    assert len(points) == 20
    assert len(set(keys(points))) == 20


def test_tpe_stops_with_none_when_every_point_was_seen():
    space = SearchSpace({"a": Categorical((1, 2, 3, 4)), "b": Boolean()})
    points = drive("tpe", space, seed=0, limit=100)
    assert sorted(keys(points)) == sorted(keys(space.iterate()))


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_tpe_visits_every_valid_point_of_a_small_constrained_space(seed):
    """TPE ignores failed (invalid) points and may keep proposing one; the sampler must still reach
    every valid point before it reports exhaustion."""
    space = small_constrained_space()
    expected = sorted(keys(space.iterate()))
    points = drive("tpe", space, seed=seed, limit=100)
    assert sorted(keys(points)) == expected


def test_feedback_failed_flag():
    assert Feedback(None).failed
    assert not Feedback(1.0).failed
    assert Feedback(1.0).violation == 0.0


def test_custom_sampler_registers_by_name():
    @quantune.register_sampler("test-first-point-only")
    class FirstOnly(quantune.Sampler):
        def bind(self, space):
            super().bind(space)
            self._done = False

        def ask(self):
            if self._done:
                return None
            self._done = True
            return next(self._require_space().iterate())

    assert "test-first-point-only" in quantune.sampler_names()
    sampler = create_sampler("test-first-point-only", seed=0)
    assert isinstance(sampler, FirstOnly)
    assert drive("test-first-point-only", SearchSpace({"a": Categorical((7, 8))})) == [{"a": 7}]
