"""The dynamic build with its models in memory (fast_shapes.py) writes the very bytes of the build through files."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.quant_utils import load_model_with_shape_infer, save_and_reload_model_with_shape_infer

from conftest import build_cnn, build_mlp, save_graph
from layernorm_model import build_layernorm_mlp
from quantune.passes.base import PassContext
from quantune.passes.onnx import dynamic_quant
from quantune.passes.onnx.dynamic_quant import DynamicQuantization, DynamicQuantizationConfig
from quantune.passes.onnx.fast_shapes import infer_like_file, infer_loaded
from test_dynamic_ceilings import build_silu_cnn


def build_gemm_net(path: Path, seed: int = 0) -> Path:
    """Conv -> Reshape (a shape initializer) -> Gemm -> Gather of an embedding-like table: the
    weights large enough to be hidden from the inference, the shape small enough to stay."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.2, (8, 3, 3, 3)).astype(np.float32), "cw"),
        numpy_helper.from_array(np.array([1, -1], np.int64), "shape"),
        numpy_helper.from_array(rng.normal(0, 0.1, (8 * 6 * 6, 40)).astype(np.float32), "gw"),
        numpy_helper.from_array(rng.normal(0, 0.1, (40,)).astype(np.float32), "gb"),
        numpy_helper.from_array(rng.normal(0, 0.1, (300, 40)).astype(np.float32), "table"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "cw"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["flat"], name="reshape"),
        helper.make_node("Gemm", ["flat", "gw", "gb"], ["g"], name="gemm"),
        helper.make_node("Gather", ["table", "ids"], ["e"], name="gather"),
        helper.make_node("Add", ["g", "e"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "gemm_net",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 40])],
        inits,
    )
    return save_graph(graph, path)


MODELS = {
    "cnn": build_cnn,
    "mlp": build_mlp,
    "silu": build_silu_cnn,
    "layernorm": build_layernorm_mlp,
    "gemm": build_gemm_net,
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_skeleton_inference_gives_onnxruntimes_models(tmp_path: Path, name: str) -> None:
    path = MODELS[name](tmp_path / f"{name}.onnx")
    model = onnx.load(str(path))
    before = model.SerializeToString()
    theirs = save_and_reload_model_with_shape_infer(model)
    ours = infer_like_file(model)
    assert ours is not None
    assert model.SerializeToString() == before, "the input model was changed"
    theirs.ClearField("metadata_props")
    assert ours.SerializeToString() == theirs.SerializeToString()
    assert len(ours.graph.value_info) > 0
    loaded = load_model_with_shape_infer(path)
    loaded.ClearField("metadata_props")
    ours = infer_loaded(onnx.load(str(path)))
    assert ours is not None and ours.SerializeToString() == loaded.SerializeToString()


CONFIGS: list[dict[str, Any]] = [
    {"weight_type": "mixed", "per_channel": True, "reduce_range": True, "pre_optimize": "extended"},
    {"weight_type": "int8", "per_channel": False, "reduce_range": False, "pre_optimize": "extended"},
    {"weight_type": "uint8", "per_channel": True, "reduce_range": False, "pre_optimize": "none"},
    {"weight_type": "int8", "per_channel": True, "reduce_range": True, "op_types_to_quantize": ["Gather"]},
]


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("params", CONFIGS, ids=lambda p: "-".join(str(v) for v in p.values()))
def test_the_in_memory_build_writes_the_bytes_of_the_file_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, params: dict[str, Any]
) -> None:
    model = MODELS[name](tmp_path / f"{name}.onnx")
    config = DynamicQuantizationConfig(**params)
    digests = {}
    for in_memory in (False, True):
        with monkeypatch.context() as patch:
            if in_memory:  # no temporary model files: onnxruntime's file-based inference is never reached
                patch.setattr(onnx.shape_inference, "infer_shapes_path", _no_files)
            else:
                patch.setattr(dynamic_quant, "fits_in_memory", lambda path: False)
            out = tmp_path / f"out-{in_memory}.onnx"
            DynamicQuantization().run(config, model, out, PassContext(None, ["x"], 1, tmp_path))
        digests[in_memory] = hashlib.sha256(out.read_bytes()).hexdigest()
    assert digests[True] == digests[False]


def _no_files(*args: object, **kwargs: object) -> None:
    raise AssertionError("onnx's file-based shape inference was called")


def test_a_weight_inside_a_subgraph_is_hidden_as_onnxruntime_hides_it(tmp_path: Path) -> None:
    """An If whose branch holds its own 2 KB weight: save_and_reload writes it as external data too."""
    weight = numpy_helper.from_array(np.arange(512, dtype=np.float32).reshape(1, 512), "bw")
    then_branch = helper.make_graph(
        [helper.make_node("Add", ["x", "bw"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 512])],
        [weight],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 512])],
    )
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x0", "w"], ["x"], name="fc"),
            helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch),
        ],
        "branchy",
        [
            helper.make_tensor_value_info("x0", TensorProto.FLOAT, [1, 512]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 512])],
        [numpy_helper.from_array(np.ones((512, 512), np.float32), "w")],
    )
    model = onnx.load(str(save_graph(graph, tmp_path / "branchy.onnx")))
    theirs = save_and_reload_model_with_shape_infer(model)
    theirs.ClearField("metadata_props")
    ours = infer_like_file(model)
    assert ours is not None and ours.SerializeToString() == theirs.SerializeToString()


def calibration_for(model: Path) -> tuple[Any, list[str]]:
    """Eight random rows for each of ``model``'s inputs (floats, or zeros for integer inputs), and their names."""
    from quantune.data.dataset import Dataset

    inputs = [
        (i.name, [d.dim_value for d in i.type.tensor_type.shape.dim], i.type.tensor_type.elem_type)
        for i in onnx.load(str(model)).graph.input
    ]
    rng = np.random.default_rng(0)
    arrays = {
        n: rng.normal(size=[8, *s[1:]]).astype(np.float32)
        if t == TensorProto.FLOAT
        else np.zeros([8, *s[1:]], np.int64)
        for n, s, t in inputs
    }
    return Dataset(arrays, "calib"), [n for n, _, _ in inputs]


STATIC_CONFIGS: list[dict[str, Any]] = [
    {"quant_format": "QDQ", "activation_type": "uint8", "per_channel": True, "reduce_range": True},
    {"quant_format": "QOperator", "activation_type": "uint8", "per_channel": False},
    {"quant_format": "QDQ", "activation_type": "int8", "per_channel": True, "calibrate_method": "Percentile"},
]


@pytest.mark.parametrize("name", ["cnn", "gemm", "layernorm"])
@pytest.mark.parametrize("params", STATIC_CONFIGS, ids=lambda p: "-".join(str(v) for v in p.values()))
def test_the_static_build_with_in_memory_shapes_writes_the_bytes_of_the_file_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, params: dict[str, Any]
) -> None:
    """Calibration and quantize_static infer shapes on the model's skeleton, never through files,
    and write the very model the file-based inference gives."""
    from quantune.passes.onnx import static_quant
    from quantune.passes.onnx.static_quant import StaticQuantization, StaticQuantizationConfig

    model = MODELS[name](tmp_path / f"{name}.onnx")
    calibration, names = calibration_for(model)
    config = StaticQuantizationConfig(**params)
    digests = {}
    for in_memory in (False, True):
        with monkeypatch.context() as patch:
            if in_memory:
                patch.setattr(onnx.shape_inference, "infer_shapes_path", _no_files)
            else:
                patch.setattr(static_quant, "fits_in_memory", lambda path: False)
            out = tmp_path / f"out-{in_memory}.onnx"
            context = PassContext(calibration, names, 1, tmp_path)
            StaticQuantization().run(config, model, out, context)
        digests[in_memory] = hashlib.sha256(out.read_bytes()).hexdigest()
    assert digests[True] == digests[False]
