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
from quantune.engine.trial import TrialRecord
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
    assert max(len(line) for line in out.splitlines()) <= width


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
        criterion={"type": "relative", "tolerable_loss": 0.01, "description": "loses at most 1%"},
        objective="latency",
        objectives=["latency"],
        stop_reason="max_trials (5) reached",
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


def _save_unchecked(graph, path: Path) -> None:
    import onnx

    onnx.save(helper.make_model(graph), str(path))
