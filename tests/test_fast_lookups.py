"""onnxruntime's quantizer with its look-ups stopping early (fast_lookups.py) writes the very bytes
of its own, static and dynamic, and gets its own functions back afterwards."""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Any

import pytest
from onnx import TensorProto, helper
from onnxruntime.quantization import onnx_model, qdq_quantizer, quant_utils

from quantune.passes.base import PassContext
from quantune.passes.onnx import dynamic_quant, fast_lookups, static_quant
from quantune.passes.onnx.dynamic_quant import DynamicQuantization, DynamicQuantizationConfig
from quantune.passes.onnx.static_quant import StaticQuantization, StaticQuantizationConfig
from test_fast_shapes import CONFIGS, MODELS, STATIC_CONFIGS, calibration_for


def _digests(build: Any, module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[bool, str]:
    """The model's sha256 built with onnxruntime's look-ups and with ours (which must have been used)."""
    digests = {}
    for fast in (False, True):
        calls = []
        with monkeypatch.context() as patch:
            if not fast:
                patch.setattr(module, "fast_lookups", contextlib.nullcontext)
            else:
                patch.setattr(fast_lookups, "find_by_name", _counted(fast_lookups.find_by_name, calls))
            out = build(tmp_path / f"out-{fast}.onnx")
        assert bool(calls) == fast  # the swap happened exactly when asked for
        digests[fast] = hashlib.sha256(out.read_bytes()).hexdigest()
    return digests


def _counted(function: Any, calls: list[int]) -> Any:
    def wrapper(*args: Any) -> Any:
        calls.append(1)
        return function(*args)

    return wrapper


@pytest.mark.parametrize("name", ["cnn", "gemm", "layernorm"])
@pytest.mark.parametrize("params", STATIC_CONFIGS, ids=lambda p: "-".join(str(v) for v in p.values()))
def test_the_static_build_writes_onnxruntimes_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, params: dict[str, Any]
) -> None:
    model = MODELS[name](tmp_path / f"{name}.onnx")
    calibration, names = calibration_for(model)
    config = StaticQuantizationConfig(**params)

    def build(out: Path) -> Path:
        StaticQuantization().run(config, model, out, PassContext(calibration, names, 1, tmp_path))
        return out

    digests = _digests(build, static_quant, tmp_path, monkeypatch)
    assert digests[True] == digests[False]


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("params", CONFIGS[:2], ids=lambda p: "-".join(str(v) for v in p.values()))
def test_the_dynamic_build_writes_onnxruntimes_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, params: dict[str, Any]
) -> None:
    model = MODELS[name](tmp_path / f"{name}.onnx")
    config = DynamicQuantizationConfig(**params)

    def build(out: Path) -> Path:
        DynamicQuantization().run(config, model, out, PassContext(None, ["x"], 1, tmp_path))
        return out

    digests = _digests(build, dynamic_quant, tmp_path, monkeypatch)
    assert digests[True] == digests[False]


def test_the_swaps_are_undone_after_the_last_of_nested_builds() -> None:
    originals = (quant_utils.find_by_name, qdq_quantizer.find_by_name, onnx_model.ONNXModel.replace_input_of_all_nodes)
    with fast_lookups.fast_lookups():
        assert quant_utils.find_by_name is fast_lookups.find_by_name
        assert qdq_quantizer.find_by_name is fast_lookups.find_by_name
        with fast_lookups.fast_lookups():
            pass
        assert quant_utils.find_by_name is fast_lookups.find_by_name  # the outer build still has them
    after = (quant_utils.find_by_name, qdq_quantizer.find_by_name, onnx_model.ONNXModel.replace_input_of_all_nodes)
    assert after == originals


def test_the_lookups_answer_as_onnxruntimes() -> None:
    """The first of several items of one name, None for a missing one; the edits reach every node
    reading the name (twice in one node too), and only those (of the named set)."""
    items = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("a", "b", "a")]
    assert fast_lookups.find_by_name("a", items) is quant_utils.find_by_name("a", items) is items[0]
    assert fast_lookups.find_by_name("z", items) is None and quant_utils.find_by_name("z", items) is None
    nodes = [
        helper.make_node("Add", ["x", "x"], ["y"], name="twice"),
        helper.make_node("Relu", ["y"], ["z"], name="other"),
        helper.make_node("Neg", ["x"], ["w"], name="once"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])], [])
    ours, theirs = (onnx_model.ONNXModel(helper.make_model(graph)) for _ in range(2))
    with fast_lookups.fast_lookups():
        ours.replace_input_of_all_nodes("x", "q")
        ours.replace_input_of_nodes("y", "p", {"other"})
    theirs.replace_input_of_all_nodes("x", "q")
    theirs.replace_input_of_nodes("y", "p", {"other"})
    assert ours.model.SerializeToString() == theirs.model.SerializeToString()
    assert [list(n.input) for n in ours.model.graph.node] == [["q", "q"], ["p"], ["q"]]
