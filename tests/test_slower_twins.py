"""Speed ceilings the runtime knows slow are not built when their fast twin is a ceiling too.

A pass declares its ``faster_twin`` (S8S8 QOperator on x86's CPU provider -> QDQ; int8
ConvInteger -> ``mixed`` weights); the quantune strategy skips such a variant only when the twin
is among its variants, and says so in its decisions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from conftest import accuracy_problem
from quantune.machine import is_x86
from quantune.passes.onnx.dynamic_quant import DynamicQuantization
from quantune.passes.onnx.static_quant import StaticQuantization
from quantune.strategy import create_strategy

CPU = "CPUExecutionProvider"


def _two_flows(make_config, **fixed: Any) -> dict[str, Any]:
    passes = [
        {"name": "static_quant", "search": True},
        {"name": "dynamic_quant", "search": True, **({"params": fixed} if fixed else {})},
    ]
    return make_config(passes, flows=[["static_quant"], ["dynamic_quant"]], search={"strategy": "quantune"})


def _labels(config: dict[str, Any], options: dict[str, Any] | None = None) -> tuple[list[str], list[str]]:
    strategy = create_strategy("quantune")
    strategy.bind(accuracy_problem(config, options))
    return [v.label for v in strategy.ceilings.ceiling_variants()], list(strategy.ceilings.skipped)


def test_the_passes_name_their_slow_kernels_and_only_those() -> None:
    conv = frozenset({"Conv", "MatMul"})
    assert DynamicQuantization.faster_twin({"weight_type": "int8"}, CPU, conv)[0] == {"weight_type": "mixed"}
    assert DynamicQuantization.faster_twin({"weight_type": "mixed"}, CPU, conv) is None
    assert (
        DynamicQuantization.faster_twin({"weight_type": "int8"}, CPU, frozenset({"MatMul"})) is None
    )  # no ConvInteger
    only_matmul = {"weight_type": "int8", "op_types_to_quantize": ["MatMul"]}
    assert DynamicQuantization.faster_twin(only_matmul, CPU, conv) is None
    s8s8 = {"quant_format": "QOperator", "activation_type": "int8", "weight_type": "int8"}
    expected = {"quant_format": "QDQ"} if is_x86() else None
    assert (StaticQuantization.faster_twin(s8s8, CPU, conv) or (None,))[0] == expected
    assert StaticQuantization.faster_twin({**s8s8, "activation_type": "uint8"}, CPU, conv) is None  # U8S8: fast
    assert StaticQuantization.faster_twin({**s8s8, "quant_format": "QDQ"}, CPU, conv) is None
    assert StaticQuantization.faster_twin(s8s8, "OpenVINOExecutionProvider", conv) is None  # the CPU provider's fact


def test_the_strategy_skips_a_slow_variant_whose_twin_it_times(make_config) -> None:
    labels, skipped = _labels(_two_flows(make_config))
    assert "dynamic_quant: dynamic mixed" in labels and "dynamic_quant: dynamic int8" not in labels  # the CNN has convs
    assert ("static_quant: QOperator/int8" in labels) != is_x86()
    assert "static_quant: QDQ/int8" in labels and "static_quant: QOperator/uint8" in labels
    assert any(line.startswith("dynamic_quant: dynamic int8 skipped: ") and "dynamic mixed" in line for line in skipped)
    assert len(labels) + len(skipped) == 8


def test_without_the_twin_or_with_the_option_off_nothing_is_skipped(make_config) -> None:
    # int8 weights fixed by the user: there is no mixed twin, so int8 is timed (and may lose)
    labels, skipped = _labels(_two_flows(make_config, weight_type="int8"))
    assert "dynamic_quant: dynamic" in labels and not any(s.startswith("dynamic") for s in skipped)
    labels, skipped = _labels(_two_flows(make_config), {"skip_slower_twins": False})
    assert skipped == [] and len(labels) == 8


@pytest.mark.skipif(not is_x86(), reason="the S8S8 QOperator rule is onnxruntime's for x86 CPUs")
def test_the_skipped_lines_reach_the_decisions(make_config) -> None:
    """Every timed ceiling slower than fp32: the decisions (the log, the report) say why each slower twin
    was skipped; the reason gives the timed ones' ratios and how many were skipped."""
    strategy = create_strategy("quantune")
    problem = dataclasses.replace(accuracy_problem(_two_flows(make_config)), latency_ratio=lambda point, flow: 1.3)
    strategy.bind(problem)
    strategy.observe_baseline({"latency_ms": 1.0})
    assert strategy.ask() is None  # no accuracy evaluation: timing alone decided
    assert any("QOperator/int8 skipped: onnxruntime runs S8S8 QOperator" in d for d in strategy.shared.decisions)
    skipped = sum(1 for d in strategy.shared.decisions if " skipped: " in d)
    assert f"; {skipped} more not built, slower twins of these" in strategy.finished_reason
