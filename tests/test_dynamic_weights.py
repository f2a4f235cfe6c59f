"""dynamic_quant's per-op weight schemes (Neural Compressor's defaults) on tiny real models.

Embedding Gathers get int8 symmetric per-tensor tables with int8 weights; ``per_channel`` is for
MatMul weights only (an LSTM keeps one scale per direction, a Conv one per tensor).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quantune
from conftest import run_model, save_graph
from quantune.passes import PassContext

VOCAB, DIM, HIDDEN, CLASSES = 50, 16, 8, 6


def run_dynamic(model: Path, tmp_path: Path, **params) -> Path:
    pass_cls = quantune.get_pass("dynamic_quant")
    out = tmp_path / f"dq-{len(list(tmp_path.glob('dq-*')))}.onnx"
    pass_cls().run(pass_cls.Config(**params), model, out, PassContext(None, ["ids"], 1, tmp_path))
    return out


def build_embedder(path: Path, *, tied: bool = False) -> Path:
    """Gather(table, ids) -> MatMul(w) -> y; ``tied``: the table also feeds a second MatMul (its transpose)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (VOCAB, DIM)).astype(np.float32), "table"),
        numpy_helper.from_array(rng.normal(0, 0.3, (DIM, CLASSES)).astype(np.float32), "w"),
    ]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed/Gather"),
        helper.make_node("MatMul", ["emb", "w"], ["y"], name="proj/MatMul"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", CLASSES])]
    if tied:
        nodes += [
            helper.make_node("Transpose", ["table"], ["table_t"], name="tie/Transpose"),
            helper.make_node("MatMul", ["emb", "table_t"], ["scores"], name="tie/MatMul"),
        ]
        outputs.append(helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", VOCAB]))
    graph = helper.make_graph(
        nodes, "embedder", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N"])], outputs, inits
    )
    return save_graph(graph, path)


def build_recurrent(path: Path) -> Path:
    """Conv -> Reshape -> bidirectional LSTM -> MatMul over ``x[1, 1, 4, 6]`` (sequence of 6 steps)."""
    rng = np.random.default_rng(1)
    arrays = {
        "cw": rng.normal(0, 0.5, (4, 1, 3, 3)),
        "W": rng.normal(0, 0.4, (2, 4 * HIDDEN, 16)),
        "R": rng.normal(0, 0.4, (2, 4 * HIDDEN, HIDDEN)),
        "B": rng.normal(0, 0.1, (2, 8 * HIDDEN)),
        "w": rng.normal(0, 0.3, (2 * HIDDEN, CLASSES)),
    }
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in arrays.items()]
    inits += [
        numpy_helper.from_array(np.array([6, 1, 16], dtype=np.int64), "seq_shape"),
        numpy_helper.from_array(np.array([6, 2 * HIDDEN], dtype=np.int64), "out_shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "cw"], ["c"], name="conv", pads=[1, 1, 1, 1]),  # [1, 4, 4, 6]
        helper.make_node("Transpose", ["c"], ["ct"], name="to_seq", perm=[3, 0, 1, 2]),  # [6, 1, 4, 4]
        helper.make_node("Reshape", ["ct", "seq_shape"], ["seq"], name="flatten"),
        helper.make_node(
            "LSTM", ["seq", "W", "R", "B"], ["h"], name="lstm", hidden_size=HIDDEN, direction="bidirectional"
        ),
        helper.make_node("Transpose", ["h"], ["ht"], name="steps", perm=[0, 2, 1, 3]),  # [6, 1, 2, H]
        helper.make_node("Reshape", ["ht", "out_shape"], ["hf"], name="join"),
        helper.make_node("MatMul", ["hf", "w"], ["y"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "recurrent",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, CLASSES])],
        inits,
    )
    return save_graph(graph, path)


def ids() -> dict[str, np.ndarray]:
    return {"ids": np.arange(VOCAB, dtype=np.int64)[::-1].copy()}


def graph_of(path: Path) -> tuple[dict[str, onnx.NodeProto], dict[str, np.ndarray]]:
    model = onnx.load(str(path))
    return {n.name: n for n in model.graph.node}, {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


@pytest.mark.parametrize("weight_type", ["int8", "mixed"])
@pytest.mark.parametrize("reduce_range", [False, True])
def test_embedding_gather_becomes_int8_symmetric(weight_type, reduce_range, tmp_path):
    model = build_embedder(tmp_path / "embedder.onnx")
    out = run_dynamic(model, tmp_path, weight_type=weight_type, reduce_range=reduce_range)
    nodes, inits = graph_of(out)
    gather = nodes["embed/Gather"]  # keeps its name
    table = inits[gather.input[0]]
    assert table.dtype == np.int8 and table.shape == (VOCAB, DIM)
    assert "table" not in inits, "the float table is gone"
    dequantize = next(n for n in nodes.values() if n.op_type == "DequantizeLinear" and n.input[0] == gather.output[0])
    scale, zero = inits[dequantize.input[1]], inits[dequantize.input[2]]
    assert scale.shape == () and zero.shape == () and zero.dtype == np.int8 and int(zero) == 0
    qmax = 64 if reduce_range else 127
    assert int(np.abs(table).max()) == qmax
    original = numpy_helper.to_array(onnx.load(str(model)).graph.initializer[0])
    np.testing.assert_allclose(float(scale), np.abs(original).max() / qmax, rtol=1e-6)
    assert "MatMulInteger" in {n.op_type for n in nodes.values()}
    got, want = run_model(out, ids())[0], run_model(model, ids())[0]
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()


def test_excluded_gather_stays_float(tmp_path):
    model = build_embedder(tmp_path / "embedder.onnx")
    out = run_dynamic(model, tmp_path, nodes_to_exclude=["embed/Gather"])
    nodes, inits = graph_of(out)
    assert nodes["embed/Gather"].input[0] == "table" and inits["table"].dtype == np.float32
    assert "DequantizeLinear" not in {n.op_type for n in nodes.values()}
    assert "MatMulInteger" in {n.op_type for n in nodes.values()}, "the MatMul is still quantized"


def test_gather_not_in_op_types_stays_float(tmp_path):
    model = build_embedder(tmp_path / "embedder.onnx")
    out = run_dynamic(model, tmp_path, op_types_to_quantize=["MatMul"])
    nodes, inits = graph_of(out)
    assert nodes["embed/Gather"].input[0] == "table" and inits["table"].dtype == np.float32


def test_gather_whose_table_feeds_another_op_stays_float(tmp_path):
    model = build_embedder(tmp_path / "tied.onnx", tied=True)
    out = run_dynamic(model, tmp_path)
    nodes, inits = graph_of(out)
    assert nodes["embed/Gather"].input[0] == "table" and inits["table"].dtype == np.float32
    got, want = run_model(out, ids()), run_model(model, ids())
    assert np.abs(got[1] - want[1]).max() <= 0.05 * np.abs(want[1]).max()


def test_uint8_weights_keep_onnxruntimes_gather(tmp_path):
    model = build_embedder(tmp_path / "embedder.onnx")
    out = run_dynamic(model, tmp_path, weight_type="uint8")
    nodes, inits = graph_of(out)
    table = inits[nodes["embed/Gather"].input[0]]
    assert table.dtype == np.uint8, "onnxruntime's asymmetric uint8 table, as before"
    assert all(v.dtype != np.int8 for v in inits.values())
    got, want = run_model(out, ids())[0], run_model(model, ids())[0]
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()


@pytest.mark.parametrize("weight_type", ["int8", "mixed"])
def test_per_channel_is_for_matmul_only(weight_type, tmp_path):
    model = build_recurrent(tmp_path / "recurrent.onnx")
    out = run_dynamic(model, tmp_path, weight_type=weight_type, per_channel=True, reduce_range=True)
    nodes, inits = graph_of(out)
    ops = {n.op_type for n in nodes.values()}
    assert {"ConvInteger", "DynamicQuantizeLSTM", "MatMulInteger"} <= ops
    lstm = next(n for n in nodes.values() if n.op_type == "DynamicQuantizeLSTM")
    # inputs 8..11: W scale, W zero point, R scale, R zero point: one per direction
    for index in (8, 10):
        assert inits[lstm.input[index]].shape == (2,)
    matmul = next(n for n in nodes.values() if n.op_type == "MatMulInteger")
    assert inits[matmul.input[3]].shape == (CLASSES,), "one zero point per output column"
    scales = [v for k, v in inits.items() if k.startswith("w_") and "scale" in k]
    assert scales and scales[0].shape == (CLASSES,)
    conv = next(n for n in nodes.values() if n.op_type == "ConvInteger")
    assert inits[conv.input[3]].size == 1, "ConvInteger's weight per tensor"
    feeds = {"x": np.random.default_rng(2).normal(0, 1, (1, 1, 4, 6)).astype(np.float32)}
    got, want = run_model(out, feeds)[0], run_model(model, feeds)[0]
    assert np.abs(got - want).max() <= 0.1 * np.abs(want).max()


def test_per_channel_off_gives_lstm_one_scale_per_direction_too(tmp_path):
    model = build_recurrent(tmp_path / "recurrent.onnx")
    out = run_dynamic(model, tmp_path, per_channel=False)
    nodes, inits = graph_of(out)
    lstm = next(n for n in nodes.values() if n.op_type == "DynamicQuantizeLSTM")
    assert inits[lstm.input[8]].shape == (2,)
    matmul = next(n for n in nodes.values() if n.op_type == "MatMulInteger")
    assert inits[matmul.input[3]].size == 1


def test_plan_calls_skips_empty_groups():
    from quantune.passes.onnx.dynamic_quant import plan_calls

    config = quantune.get_pass("dynamic_quant").Config
    minilm = {"MatMul", "Gather", "Transpose", "Add", "LayerNormalization"}
    assert [c[:2] for c in plan_calls(config(per_channel=True), minilm)] == [("int8", True)]
    captcha = {"Conv", "LSTM", "MatMul", "Transpose"}
    calls = plan_calls(config(weight_type="mixed", per_channel=True), captcha)
    assert [c[:2] for c in calls] == [("uint8", False), ("int8", True), ("int8", False)]
    assert "LSTM" in calls[2][2] and "LSTM" not in calls[1][2] and "MatMul" in calls[1][2]
    assert plan_calls(config(), {"Transpose", "Add"}) == []


def test_excluded_gemm_stays_float(tmp_path):
    """onnxruntime renames a Gemm to ``<name>_MatMul`` before it reads nodes_to_exclude: the Gemm's own name must hold."""
    from conftest import build_mlp

    model = build_mlp(tmp_path / "mlp.onnx")
    out = run_dynamic(model, tmp_path, nodes_to_exclude=["fc"])
    nodes, inits = graph_of(out)
    assert inits["w2"].dtype == np.float32, "the excluded Gemm keeps its float weight"
    assert nodes["fc_MatMul"].op_type == "MatMul"
    assert "MatMulInteger" in {n.op_type for n in nodes.values()}, "the other MatMul is quantized"


def test_gemm_alone_is_quantized_per_channel(tmp_path):
    """A Gemm (no MatMul in the model) makes the MatMul call: onnxruntime quantizes it as a MatMul."""
    from conftest import build_cnn

    model = build_cnn(tmp_path / "cnn.onnx")
    out = run_dynamic(model, tmp_path, weight_type="mixed", per_channel=True)
    ops = [n.op_type for n in onnx.load(str(out)).graph.node]
    assert "MatMulInteger" in ops and "ConvInteger" in ops


def test_gathers_alone(tmp_path):
    """op_types_to_quantize [Gather] with int8 weights: no onnxruntime call, the table int8, the MatMul float."""
    model = build_embedder(tmp_path / "embedder.onnx")
    out = run_dynamic(model, tmp_path, op_types_to_quantize=["Gather"])
    nodes, inits = graph_of(out)
    assert inits[nodes["embed/Gather"].input[0]].dtype == np.int8
    assert nodes["proj/MatMul"].op_type == "MatMul" and inits["w"].dtype == np.float32
    got, want = run_model(out, ids())[0], run_model(model, ids())[0]
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()
