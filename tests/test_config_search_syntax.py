"""Config syntax for search parameters: weights, ranges, joint parameters, conditionals with
domains, several flows, and user rules over resolved pass parameters."""

from __future__ import annotations

from typing import Any

import pytest

import quantune
from quantune.config import Config
from quantune.engine.plan.plan import FLOW, build_plan
from quantune.search import create_sampler


def plan_for(passes: list[dict[str, Any]], **extra: Any):
    config = Config.model_validate(
        {"model": "unused.onnx", "data": {"evaluation": "unused.npz"}, "passes": passes, **extra}
    )
    return build_plan(config)


def static(params: dict[str, Any], **entry: Any) -> dict[str, Any]:
    return {"name": "static_quant", "params": params, **entry}


def test_weights_order_exhaustive_search():
    plan = plan_for([static({"calibrate_method": {"search": {"values": ["MinMax", "Entropy"], "weights": [1, 5]}}})])
    order = [point["static_quant.calibrate_method"] for point in plan.space.iterate()]
    assert order == ["Entropy", "MinMax"]


def test_integer_range_with_step_reaches_the_pass_config():
    plan = plan_for([static({"calibration_samples": {"search": {"int": [16, 64], "step": 16}}})])
    assert plan.space.raw_size() == 4
    samples = [plan.configs_for(p)[0][1].calibration_samples for p in plan.space.iterate()]
    assert samples == [16, 32, 48, 64]


def test_continuous_float_range_is_sampled_but_not_enumerated():
    plan = plan_for([static({"percentile": {"search": {"float": [99.0, 99.999], "log": True}}})])
    sampler = create_sampler("random", seed=0)
    sampler.bind(plan.space)
    values = [sampler.ask()["static_quant.percentile"] for _ in range(20)]
    assert all(99.0 <= v <= 99.999 for v in values) and len(set(values)) == 20
    exhaustive = create_sampler("exhaustive")
    with pytest.raises(quantune.QuantuneError, match="continuous"):
        exhaustive.bind(plan.space)


def test_range_values_are_checked_against_the_pass_config():
    with pytest.raises(quantune.ConfigError, match="percentile"):
        plan_for([static({"percentile": {"search": {"float": [90.0, 120.0], "step": 10.0}}})])


def test_joint_parameters_move_together():
    plan = plan_for(
        [
            static(
                {},
                joint=[
                    {"params": ["activation_type", "weight_type"], "values": [["uint8", "int8"], ["int16", "int16"]]}
                ],
            )
        ]
    )
    pairs = {(c.activation_type, c.weight_type) for p in plan.space.iterate() for _, c in plan.configs_for(p)}
    assert pairs == {("uint8", "int8"), ("int16", "int16")}


def test_joint_values_are_validated():
    with pytest.raises(quantune.ConfigError, match=r"joint\[0\]"):
        plan_for([static({}, joint=[{"params": ["activation_type", "weight_type"], "values": [["uint8", "int4"]]}])])


def test_conditional_case_can_be_a_range():
    plan = plan_for(
        [
            static(
                {
                    "calibrate_method": {"search": ["MinMax", "Percentile"]},
                    "percentile": {
                        "search": {
                            "when": "calibrate_method",
                            "cases": {"Percentile": {"float": [99.9, 99.99], "step": 0.03}},
                        }
                    },
                }
            )
        ]
    )
    points = list(plan.space.iterate())
    assert len(points) == 1 + 4  # MinMax alone; Percentile with 99.9, 99.93, 99.96, 99.99
    assert all(("static_quant.percentile" in p) == (p["static_quant.calibrate_method"] == "Percentile") for p in points)


def test_ranges_work_in_configs_with_several_flows():
    plan = plan_for(
        [
            {"id": "a", "name": "graph_opt", "params": {"level": {"search": ["basic", "extended"]}}},
            static({"calibration_samples": {"search": {"int": [8, 24], "step": 8}}}, id="s"),
        ],
        flows=[["a"], ["a", "s"]],
    )
    sizes = {name: plan.flow_space(name).raw_size() for name in plan.flows}
    assert sizes == {"a": 2, "a>s": 6}
    for point in plan.space.iterate():
        assert ("s.calibration_samples" in point) == (point[FLOW] == "a>s")


def test_rules_see_joint_and_fixed_values():
    plan = plan_for(
        [
            static(
                {"per_channel": {"search": [False, True]}},
                joint=[{"params": ["activation_type", "weight_type"], "values": [["uint8", "int8"], ["int8", "int8"]]}],
            )
        ],
        rules=[{"when": {"static_quant.activation_type": "int8"}, "forbid": {"static_quant.per_channel": [True]}}],
    )
    combos = {(c.activation_type, c.per_channel) for p in plan.space.iterate() for _, c in plan.configs_for(p)}
    assert combos == {("uint8", False), ("uint8", True), ("int8", False)}


def test_rule_naming_an_unknown_parameter_is_a_config_error():
    with pytest.raises(quantune.ConfigError, match=r"rules\[0\]"):
        plan_for([static({})], rules=[{"forbid": {"static_quant.bogus": [1]}}])


def _symmetric_when(cases: dict[str, Any], parents: Any = ("activation_type", "quant_format")) -> dict[str, Any]:
    return {"search": {"when": list(parents), "cases": cases}}


def test_conditional_on_two_parents():
    plan = plan_for(
        [
            static(
                {
                    "activation_type": {"search": ["uint8", "int8"]},
                    "quant_format": {"search": ["QDQ", "QOperator"]},
                    "activation_symmetric": _symmetric_when({"int8, QDQ": [False, True]}),
                }
            )
        ]
    )
    points = list(plan.space.iterate())
    assert len(points) == 3 + 2  # three combinations without it, int8+QDQ with both values
    for point in points:
        active = point["static_quant.activation_type"] == "int8" and point["static_quant.quant_format"] == "QDQ"
        assert ("static_quant.activation_symmetric" in point) == active


def test_conditional_parents_that_are_fixed_settle_the_cases():
    one_fixed = plan_for(
        [
            static(
                {
                    "activation_type": {"search": ["uint8", "int8"]},
                    "quant_format": "QDQ",
                    "activation_symmetric": _symmetric_when({"int8, QDQ": [False, True], "int8, QOperator": [True]}),
                }
            )
        ]
    )
    assert len(list(one_fixed.space.iterate())) == 1 + 2
    none_match = plan_for(
        [
            static(
                {
                    "activation_type": "uint8",
                    "quant_format": "QDQ",
                    "activation_symmetric": _symmetric_when({"int8, QDQ": [False, True]}),
                }
            )
        ]
    )
    assert "static_quant.activation_symmetric" not in none_match.space.params
    all_match = plan_for(
        [
            static(
                {
                    "per_channel": True,
                    "quant_format": "QDQ",
                    "reduce_range": _symmetric_when(
                        {"true, QDQ": [False, True]}, parents=("per_channel", "quant_format")
                    ),
                }
            )
        ]
    )
    assert sorted(p["static_quant.reduce_range"] for p in all_match.space.iterate()) == [False, True]


def test_conditional_case_must_name_one_value_per_parent():
    with pytest.raises(quantune.ConfigError, match="one value per parameter"):
        plan_for(
            [
                static(
                    {
                        "activation_type": {"search": ["uint8", "int8"]},
                        "quant_format": {"search": ["QDQ", "QOperator"]},
                        "activation_symmetric": _symmetric_when({"int8": [False, True]}),
                    }
                )
            ]
        )
