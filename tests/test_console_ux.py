"""The console: ``--version``, ``quantune passes`` at any width, long parameter lists summarized."""

from __future__ import annotations

import io
import re
from importlib.metadata import version
from pathlib import Path

import pytest
from onnx import TensorProto, helper
from rich.console import Console

import quantune
from quantune.cli import main
from quantune.engine.trials.trial import TrialRecord
from quantune.evaluate.criterion import Criterion
from quantune.report import Result
from quantune.report.console import render_result
from quantune.report.passes_table import pass_rows, render_passes
from quantune.report.summarize import summarize_value


def test_version_names_quantune_and_onnxruntime(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert f"quantune {quantune.__version__}" in out
    assert f"onnxruntime {version('onnxruntime')}" in out and f"onnx {version('onnx')}" in out


@pytest.mark.parametrize("width", [30, 50, 80, 160])
def test_passes_never_cuts_a_parameter_name(width):
    buffer = io.StringIO()
    render_passes(Console(file=buffer, width=width, color_system=None))
    out = buffer.getvalue()
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", out))
    for name, param, _, _ in pass_rows():
        assert param in words, f"{param} cut at width {width}"
        assert name in words
    assert "…" not in out
    longest = max(len(param) for _, param, _, _ in pass_rows())  # a name longer than the screen is never cut
    assert max(len(line) for line in out.splitlines()) <= max(width, longest)


def test_long_node_lists_are_counted_by_op_type():
    op_types = {f"add{i}": "Add" for i in range(12)} | {f"mul{i}": "Mul" for i in range(9)}
    op_types |= {f"conv{i}": "Conv" for i in range(5)} | {f"relu{i}": "Relu" for i in range(2)}
    nodes = [*op_types, "gone"]
    text = summarize_value("nodes_to_exclude", nodes, op_types)
    assert text == "29 nodes excluded: 12 Add, 9 Mul, 5 Conv, 3 other"
    assert summarize_value("nodes_to_exclude", ["a", "b"], op_types) is None  # short: shown as it is
    assert summarize_value("nodes_to_exclude", nodes, {}) == "29 nodes excluded"
    assert summarize_value("tensor_overrides", {str(i): {} for i in range(7)}) == "tensor_overrides: 7 entries"


def test_run_table_stays_short_with_hundreds_of_excluded_nodes(tmp_path: Path):
    names = [f"block{i}/add" for i in range(300)] + [f"block{i}/mul" for i in range(200)]
    nodes = [
        helper.make_node("Add" if name.endswith("add") else "Mul", ["x", "x"], [f"y{i}"], name=name)
        for i, name in enumerate(names)
    ]
    graph = helper.make_graph(
        nodes,
        "many",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y0", TensorProto.FLOAT, [1])],
    )
    model = tmp_path / "prepared.onnx"
    _save_unchecked(graph, model)
    metrics = {
        "top1": 0.9,
        "latency_ms": 1.0,
        "size_bytes": 1000.0,
        "quantized_ops": 3,
        "quantized_compute_fraction": 1,
    }
    trials = [
        TrialRecord(
            number=i,
            flow=["static_quant"],
            params={"static_quant.quant_format": "QDQ", "static_quant.nodes_to_exclude": names[: 100 * (i + 1)]},
            status="ok",
            metrics=metrics,
            meets_criterion=True,
            accuracy_loss=0.0,
            objective=1.0,
            cache={"static_quant": "miss"},
        )
        for i in range(5)
    ]
    result = Result(
        baseline=dict(metrics, quantized_ops=0),
        trials=trials,
        best=None,
        closest_miss=None,
        pareto_front=[],
        metric="top1",
        criterion=Criterion("relative", 0.01),
        objective="latency",
        objectives=["latency"],
        stop_reason="max_trials (5) reached after trial 4 (+ 1/2 to int8, fp32 [block0/add])",
        duration_s=1.0,
        output_dir=tmp_path,
        verdict="keep_original",
        preparation={"model": str(model)},
    )
    buffer = io.StringIO()
    render_result(result, Console(file=buffer, width=100, color_system=None))
    out = buffer.getvalue()
    assert len(out.splitlines()) < 40, out
    assert "500 nodes excluded: 300 Add, 200 Mul" in out
    assert "block7/add" not in out
    assert "fp32 [block0/add])" in " ".join(out.split()), out  # a stage's node list in the title is no markup


def _save_unchecked(graph, path: Path) -> None:
    import onnx

    onnx.save(helper.make_model(graph), str(path))


def test_pass_names_are_not_cut_in_a_narrow_table(tmp_path: Path):
    metric = "metric.py:char_accuracy"
    metrics = {
        metric: 0.68,
        "latency_ms": 115.649,
        "latency_search_ms": 76.5,
        "size_bytes": 26179555.0,
        "quantized_ops": 22,
    }
    trials = [
        TrialRecord(
            number=i,
            flow=["static_quant"],
            params={"flow": "static_quant", "static_quant.quant_format": "QOperator", "static_quant.per_channel": True},
            status="ok",
            metrics=metrics,
            meets_criterion=True,
            accuracy_loss=-0.0277,
            objective=115.6,
            cache={"static_quant": "miss", "evaluation": "miss"},
        )
        for i in range(2)
    ]
    result = Result(
        baseline=dict(metrics, latency_ms=190.659, size_bytes=54088704.0, quantized_ops=0),
        trials=trials,
        best=None,
        closest_miss=None,
        pareto_front=[],
        metric=metric,
        criterion=Criterion("relative", 0.01),
        objective="latency",
        objectives=["latency"],
        stop_reason="max_trials (2) reached",
        duration_s=1.0,
        output_dir=tmp_path,
        verdict="keep_original",
    )
    buffer = io.StringIO()
    render_result(result, Console(file=buffer, width=80, color_system=None))
    out = buffer.getvalue()
    assert "static_quant" in out and "static_quan " not in out.replace("│", " ")
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "cache │" in out.replace("┃", "│")  # every column shown, none cut off
    assert "criterion: char_accuracy" in out  # the long metric name is in the summary
