"""bench/tools/olive_tool.py's reading of Olive's footprint, and bench/passes_minilm.py's row options.

The footprint is the JSON Olive 0.13 writes (``output/footprint.json``): one node per model, its
pass, its parent, its metrics and whether it met the goals. The functions run in quantune's venv
(no Olive import), so they are checked here on a footprint of the shape Olive writes.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "bench" / "tools" / "olive_tool.py"
PASSES = REPO / "bench" / "passes_minilm.py"


def load(path: Path, name: str):
    sys.path.insert(0, str(path.parent if path.parent.name != "tools" else path.parents[1]))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def node(parent, from_pass, config=None, accuracy=None, latency=None, met=None, path=None) -> dict:
    metrics = None
    if accuracy is not None:
        metrics = {
            "value": {"accuracy-score": {"value": accuracy}, "latency-avg": {"value": latency}},
            "if_goals_met": met,
        }
    return {
        "parent_model_id": parent,
        "from_pass": from_pass,
        "pass_run_config": config,
        "metrics": metrics,
        "model_config": {"type": "ONNXModel", "config": {"model_path": path}} if path else None,
    }


@pytest.fixture
def footprint(tmp_path: Path) -> Path:
    """input -> fusion -> {static QDQ (met, slow), dynamic (met, fast), dynamic int8 (missed, fastest)}."""
    for name in ("qdq", "dyn", "dyn8"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.onnx").write_bytes(b"")
    ignored = {"type": "Conditional", "support": {}}  # what Olive leaves for a parameter the point ignored
    nodes = {
        "in": node(None, None, accuracy=0.63, latency=16.0, met=True),
        "fuse": node("in", "orttransformersoptimization", {"model_type": "bert"}, path=str(tmp_path / "fused.onnx")),
        "q1": node("fuse", "onnxquantization", {"quant_mode": "static", "quant_format": "QDQ", "precision": "uint8"}),
        "t1": node("q1", "ortsessionparamstuning", {}, 0.632, 17.5, True, str(tmp_path / "qdq")),
        "q2": node(
            "fuse", "onnxquantization", {"quant_mode": "dynamic", "quant_format": ignored, "precision": "uint8"}
        ),
        "t2": node("q2", "ortsessionparamstuning", {}, 0.627, 12.2, True, str(tmp_path / "dyn" / "model.onnx")),
        "q3": node("fuse", "onnxquantization", {"quant_mode": "dynamic", "precision": "int8"}),
        "t3": node("q3", "ortsessionparamstuning", {}, 0.619, 10.2, False, str(tmp_path / "dyn8" / "model.onnx")),
    }
    (tmp_path / "output").mkdir()
    path = tmp_path / "output" / "footprint.json"
    path.write_text(json.dumps({"nodes": nodes}))
    return tmp_path


def test_fastest_in_budget_is_the_fastest_model_that_met_the_goals(footprint: Path) -> None:
    tool = load(TOOL, "olive_tool_under_test")
    nodes = tool.footprint_nodes(footprint)
    fastest = tool.fastest_in_budget(nodes)
    # t3 is faster but missed the budget; the input model (no pass) is not a candidate
    assert fastest["model"] == str(footprint / "dyn" / "model.onnx")
    assert fastest["olive_latency_avg_ms"] == 12.2
    assert [step["pass"] for step in fastest["recipe"]] == [
        "orttransformersoptimization",
        "onnxquantization",
        "ortsessionparamstuning",
    ]
    # the parameter the dynamic point ignored is left out, the chosen ones are kept
    assert fastest["recipe"][1] == {"pass": "onnxquantization", "quant_mode": "dynamic", "precision": "uint8"}


def test_a_model_folder_resolves_to_its_onnx_file_and_no_footprint_gives_nothing(footprint: Path) -> None:
    tool = load(TOOL, "olive_tool_under_test")
    nodes = tool.footprint_nodes(footprint)
    del nodes["t2"]  # now the QDQ model (a folder in the footprint) is the fastest within the budget
    assert tool.fastest_in_budget(nodes)["model"] == str(footprint / "qdq" / "model.onnx")
    assert tool.footprint_nodes(footprint / "nowhere") == {}
    assert tool.fastest_in_budget({}) is None
    assert tool.recipe_of("missing", nodes) is None


def test_olive_rows_name_their_passes() -> None:
    tool = load(TOOL, "olive_tool_under_test")
    assert list(tool.passes("bert")) == ["transformers_optimization", "quantization", "session_params_tuning"]
    assert list(tool.passes("bert-nosession")) == ["transformers_optimization", "quantization"]
    assert tool.passes("dynamic")["quantization"]["type"] == "OnnxDynamicQuantization"
    with pytest.raises(SystemExit, match="unknown approach"):
        tool.passes("int4")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rows", "before,nonsense"], "unknown ['nonsense']"),
        (["--rows", "olive-bert-fastest"], "unknown ['olive-bert-fastest']"),  # derived from olive-bert's run
        (["--reuse", "/nonexistent-run"], "has no rows.json"),
    ],
)
def test_passes_minilm_rejects_rows_it_cannot_run(argv: list[str], message: str, monkeypatch, capsys) -> None:
    pytest.importorskip("yaml")
    bench = load(PASSES, "passes_minilm_under_test")
    monkeypatch.setattr(sys, "argv", ["passes_minilm.py", *argv])
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args()
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_passes_minilm_reuse_alone_reruns_nothing_and_rows_keep_the_table_order(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("yaml")
    bench = load(PASSES, "passes_minilm_under_test")
    (tmp_path / "rows.json").write_text("{}")
    monkeypatch.setattr(sys, "argv", ["passes_minilm.py", "--reuse", str(tmp_path)])
    assert bench.parse_args().chosen == ["fp32"]
    monkeypatch.setattr(sys, "argv", ["passes_minilm.py", "--rows", "inc-mse_v2-dynamic,before"])
    assert bench.parse_args().chosen == ["fp32", "before", "inc-mse_v2-dynamic"]
