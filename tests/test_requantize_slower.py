"""In a latency run, a group put back in int8 stays there only when the model is not slower.

The recovery's last steps (the op types added back, the prune) re-quantize what the accuracy budget
does not need, to give speed back; yet it does not always. On the NudeNet detector the prune put the
first conv back in int8 (1.05-1.07x slower), leaving the search's answer ~5% behind a model it had
passed, and the same run twice ended at one or the other. Such a step is now timed side by side
against the model before it and kept only when not slower beyond the noise.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from conftest import accuracy_problem
from quantune.space import Point
from quantune.strategy import Outcome, create_strategy
from test_answer_early import _drive, _fast, _layernorm

EXCLUDE = "static_quant.nodes_to_exclude"


def _run(tmp_path: Path, requantized_ratio: float) -> tuple[list[tuple[Point, str]], Any]:
    """The quantune strategy on the LayerNorm MLP (MatMuls, and Add/Mul/Div): the ceiling misses, any
    fallback meets; a model with fewer nodes in fp32 than its reference times ``requantized_ratio`` x it."""

    def paired(candidate: Point, cflow: Any, reference: Point, rflow: Any) -> dict[str, Any]:
        mine, theirs = set(candidate.get(EXCLUDE) or []), set(reference.get(EXCLUDE) or [])
        ratio = 0.8 if not mine else requantized_ratio if mine < theirs else 1.0  # the ceiling: faster
        return {
            "ratio_median": ratio,
            "ratio_ci_low": ratio * 0.97,
            "ratio_ci_high": ratio * 1.03,
            "faster": ratio < 0.9,
        }

    config = _layernorm(tmp_path, "latency")
    config["stop"]["max_trials"] = 40
    problem = dataclasses.replace(accuracy_problem(config), latency_ratio=_fast, paired_latency=paired)
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    strategy.observe_baseline({"latency_ms": 1.0})

    def judge(point: Point) -> Outcome:
        meets = bool(point.get(EXCLUDE))
        return Outcome(1.0, 0.0 if meets else 0.1, meets, {"latency_ms": 1.0})

    return _drive(strategy, judge), strategy


@pytest.mark.parametrize("ratio", [1.10, 1.0])
def test_a_group_back_in_int8_is_kept_only_when_the_model_is_not_slower(tmp_path: Path, ratio: float) -> None:
    seen, strategy = _run(tmp_path, ratio)
    added = [stage for point, stage in seen if stage.startswith("op types: +")]
    assert added, [stage for _, stage in seen]  # the op-type stage added op types back, each in budget
    rejected = [line for line in strategy.shared.decisions if line.endswith("side by side: not kept")]
    reason = strategy.finished_reason
    if ratio > 1.0:  # each slower: none kept, the latency stage starts from the op-type stage's model
        assert len(rejected) == len(added) and f"{ratio:.2f}x the model before" in rejected[0]
        assert "from a trial (int8 ['MatMul'] only)" in reason, reason
    else:  # the same speed: kept (a tie keeps the model with more in int8, as before)
        assert not rejected
        assert f"from a trial ({added[0].removeprefix('op types: ')})" in reason, reason


@pytest.mark.parametrize("ratio", [1.10, 1.0])
def test_the_prune_and_a_unit_back_with_per_channel_weights_are_kept_only_when_not_slower(
    make_config, ratio: float
) -> None:
    """The conv net of ``make_config``: only conv2 in fp32 holds the budget. The bisection puts conv1
    and conv2 in fp32; the prune, then the per-channel unit stage, try conv1 back in int8 (in budget):
    slower side by side, neither is kept and the search ends from the bisection's model."""
    config = make_config([{"name": "static_quant", "search": True}], search={"strategy": "quantune"})
    config["stop"] = {"max_trials": 40}

    def paired(candidate: Point, cflow: Any, reference: Point, rflow: Any) -> dict[str, Any]:
        mine, theirs = set(candidate.get(EXCLUDE) or []), set(reference.get(EXCLUDE) or [])
        slower = bool(mine) and mine < theirs
        median = ratio if slower else 0.8 if not mine else 1.0  # the ceiling over a fallback: faster
        return {
            "ratio_median": median,
            "ratio_ci_low": median * 0.97,
            "ratio_ci_high": median * 1.03,
            "faster": median < 0.9,
        }

    problem = dataclasses.replace(accuracy_problem(config), latency_ratio=_fast, paired_latency=paired)
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    strategy.observe_baseline({"latency_ms": 1.0})

    def judge(point: Point) -> Outcome:
        meets = "conv2" in (point.get(EXCLUDE) or [])
        return Outcome(1.0, 0.0 if meets else 0.1, meets, {"latency_ms": 1.0})

    stages = [stage for _, stage in _drive(strategy, judge)]
    assert "prune: conv1 -> int8" in stages, stages
    rejected = [line.split(":", 2)[:2] for line in strategy.shared.decisions if line.endswith("side by side: not kept")]
    if ratio > 1.0:
        assert [stage for stage, _ in rejected] == ["prune", "recover targeted"], rejected
        assert "from a trial (k=2/3 [conv1, conv2])" in strategy.finished_reason
    else:
        assert not rejected
        assert "from a trial (conv1 -> int8)" in strategy.finished_reason
