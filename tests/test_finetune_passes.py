"""bias_correction and fast_finetune (AdaRound, AdaQuant) after static_quant, on models built to need them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import build_cnn, cnn_inputs, run_model, save_graph
from quantune.config import Config
from quantune.data import Dataset
from quantune.engine.plan.plan import build_plan
from quantune.errors import TrialError
from quantune.model import file_sha256
from quantune.passes import PassContext, get_pass
from quantune.passes.onnx.qdq_layers import integer_weight, quantized_layers

FEATURES, HIDDEN, OUT = 16, 32, 8
SCALE = 60.0


def build_outlier_mlp(path: Path, seed: int = 0) -> Path:
    """Gemm -> Relu -> Gemm -> Relu -> Gemm where a few hidden units of the first Gemm are scaled
    x60 (and the next Gemm's matching inputs /60): the same function, but one per-tensor int8
    scale per weight leaves the ordinary units a handful of levels -- plain int8 misses."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.4, (HIDDEN, FEATURES))
    b1 = rng.normal(0, 0.1, HIDDEN)
    w2 = rng.normal(0, 0.3, (HIDDEN, HIDDEN))
    b2 = rng.normal(0, 0.1, HIDDEN)
    w3 = rng.normal(0, 0.3, (OUT, HIDDEN))
    b3 = rng.normal(0, 0.1, OUT)
    w1[:3] *= SCALE
    b1[:3] *= SCALE
    w2[:, :3] /= SCALE
    arrays = {"w1": w1, "b1": b1, "w2": w2, "b2": b2, "w3": w3, "b3": b3}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in arrays.items()]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], name="fc1", transB=1),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
        helper.make_node("Gemm", ["r1", "w2", "b2"], ["h2"], name="fc2", transB=1),
        helper.make_node("Relu", ["h2"], ["r2"], name="relu2"),
        helper.make_node("Gemm", ["r2", "w3", "b3"], ["y"], name="fc3", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "outlier_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", OUT])],
        inits,
    )
    return save_graph(graph, path)


def _inputs(rows: int, seed: int) -> np.ndarray:
    """Features with a mean (like the output of a ReLU): weight rounding errors then shift the
    outputs systematically -- what bias correction removes and a better rounding avoids."""
    return np.random.default_rng(seed).normal(1.0, 0.5, (rows, FEATURES)).astype(np.float32)


def _run(name: str, params: dict, model_in: Path, tmp: Path, rows: np.ndarray, input_name: str = "x") -> Path:
    """One pass as a flow step runs it (its cache folder under ``tmp/cache``)."""
    pass_cls = get_pass(name)
    out = tmp / f"{name}-{len(list(tmp.glob('*.onnx')))}.onnx"
    context = PassContext(
        Dataset({input_name: rows}, "calib"), [input_name], 32, tmp, file_sha256(model_in), tmp / "cache" / name
    )
    pass_cls().run(pass_cls.Config.model_validate(params), model_in, out, context)
    return out


def _error(model: Path, reference: Path, feeds: dict[str, np.ndarray]) -> float:
    return float(np.mean((run_model(model, feeds)[0] - run_model(reference, feeds)[0]) ** 2))


@pytest.fixture
def quantized(tmp_path: Path) -> tuple[Path, Path, np.ndarray, dict[str, np.ndarray]]:
    """(float model, its per-tensor static QDQ model, calibration rows, held-out feeds)."""
    model = build_outlier_mlp(tmp_path / "mlp.onnx")
    calib = _inputs(256, seed=1)
    qdq = _run("static_quant", {"per_channel": False}, model, tmp_path, calib)
    return model, qdq, calib, {"x": _inputs(200, seed=2)}


def test_bias_correction_lowers_the_error_and_keeps_the_graph(quantized, tmp_path: Path) -> None:
    model, qdq, calib, held_out = quantized
    corrected = _run("bias_correction", {}, qdq, tmp_path, calib)
    assert _error(corrected, model, held_out) < 0.6 * _error(qdq, model, held_out)
    before, after = onnx.load(str(qdq)), onnx.load(str(corrected))
    assert [n.op_type for n in before.graph.node] == [n.op_type for n in after.graph.node]
    weights = {layer.name: integer_weight(before, layer) for layer in quantized_layers(before)}
    for layer in quantized_layers(after):  # only biases moved
        assert np.array_equal(integer_weight(after, layer), weights[layer.name])


@pytest.mark.parametrize("optim", ["adaround", "adaquant"])
def test_fast_finetune_recovers_what_plain_int8_loses(quantized, tmp_path: Path, optim: str) -> None:
    model, qdq, calib, held_out = quantized
    tuned = _run("fast_finetune", {"optim": optim, "iterations": 300, "learning_rate": 0.02}, qdq, tmp_path, calib)
    assert _error(tuned, model, held_out) < 0.6 * _error(qdq, model, held_out)
    before, after = onnx.load(str(qdq)), onnx.load(str(tuned))
    assert [n.op_type for n in before.graph.node] == [n.op_type for n in after.graph.node]
    changed = 0
    for old, new in zip(quantized_layers(before), quantized_layers(after), strict=True):
        ints_old, ints_new = integer_weight(before, old), integer_weight(after, new)
        assert ints_new.dtype == ints_old.dtype and ints_new.min() >= new.qmin and ints_new.max() <= new.qmax
        changed += int(not np.array_equal(ints_old, ints_new))
        if optim == "adaround":  # each weight rounded down or up from its float value, never further
            assert np.max(np.abs(ints_new - ints_old)) <= 1
    assert changed >= 1


def test_fast_finetune_on_a_cnn_with_float_weights_kept_beside_their_qdq_pair(tmp_path: Path) -> None:
    """Conv layers (im2col path), and AddQDQPairToWeight models (float weights quantized at load)."""
    model = build_cnn(tmp_path / "cnn.onnx")
    calib = cnn_inputs(64, seed=1)
    params = {"per_channel": True, "add_qdq_pair_to_weight": True}
    qdq = _run("static_quant", params, model, tmp_path, calib, "input")
    tuned = _run("fast_finetune", {"iterations": 100}, qdq, tmp_path, calib, "input")
    held_out = {"input": cnn_inputs(64, seed=2)}
    assert _error(tuned, model, held_out) <= _error(qdq, model, held_out)
    layers = quantized_layers(onnx.load(str(tuned)))
    assert {layer.node.op_type for layer in layers} == {"Conv", "Gemm"}
    assert all(layer.float_stored for layer in layers)


@pytest.mark.parametrize("name", ["bias_correction", "fast_finetune"])
def test_refining_a_model_static_quant_did_not_make_is_one_clear_error(tmp_path: Path, name: str) -> None:
    model = build_outlier_mlp(tmp_path / "mlp.onnx")
    with pytest.raises(TrialError, match="after static_quant"):
        _run(name, {}, model, tmp_path, _inputs(32, seed=1))


@pytest.mark.parametrize("name", ["bias_correction", "fast_finetune"])
def test_accepts_only_a_qdq_static_quant_upstream(name: str) -> None:
    pass_cls, quant = get_pass(name), get_pass("static_quant")
    config = pass_cls.Config()
    assert pass_cls.accepts(config, [("static_quant", quant.Config(quant_format="QDQ"))])
    assert not pass_cls.accepts(config, [("static_quant", quant.Config(quant_format="QOperator"))])
    assert not pass_cls.accepts(config, [("graph_opt", get_pass("graph_opt").Config())])


def test_search_true_searches_optim_and_num_iter_lr_jointly(tmp_path: Path) -> None:
    config = Config.model_validate(
        {
            "model": str(tmp_path / "m.onnx"),
            "data": {"calibration": "c.npz", "evaluation": "e.npz"},
            "passes": [
                {"name": "static_quant", "params": {"quant_format": "QDQ"}},
                {"id": "ft", "name": "fast_finetune", "search": True},
            ],
        }
    )
    plan = build_plan(config)
    assert {"ft.optim", "ft.num_iter_lr"} <= set(plan.space.params)
    values = plan.space.params["ft.num_iter_lr"].values
    for value in values:
        ft = plan.steps["ft"].config_for({"ft.num_iter_lr": value, "ft.optim": "adaquant"})
        assert (ft.iterations, ft.learning_rate) == tuple(value) and ft.optim == "adaquant"
    # a member given a value of its own: the default joint steps aside
    config.passes[1].params["learning_rate"] = {"search": {"float": [0.001, 0.1], "log": True}}
    plan = build_plan(config)
    assert "ft.num_iter_lr" not in plan.space.params and "ft.learning_rate" in plan.space.params


def test_adaquant_on_matmul_layers_keeps_a_valid_graph(tmp_path: Path) -> None:
    """MatMul has no bias input: its weights are fitted, nothing is added to the node."""
    from conftest import build_mlp, mlp_inputs

    model = build_mlp(tmp_path / "mlp.onnx")
    calib = mlp_inputs(128, seed=1)
    qdq = _run("static_quant", {}, model, tmp_path, calib)
    tuned = _run("fast_finetune", {"optim": "adaquant", "iterations": 50}, qdq, tmp_path, calib)
    loaded = onnx.load(str(tuned))
    onnx.checker.check_model(loaded)
    assert all(len(n.input) == 2 for n in loaded.graph.node if n.op_type == "MatMul")
    held_out = {"x": mlp_inputs(64, seed=2)}
    assert _error(tuned, model, held_out) <= _error(qdq, model, held_out) * 1.05


@pytest.mark.parametrize(
    ("shape", "weight", "attrs"),
    [
        ((2, 4, 9, 7), (6, 4, 3, 3), {"pads": [1, 0, 1, 2], "strides": [2, 1], "dilations": [1, 2]}),
        ((2, 4, 8, 8), (8, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
        ((2, 3, 11), (5, 3, 3), {"pads": [1, 1], "strides": [2]}),
    ],
    ids=["2d-stride-dilation", "grouped", "1d"],
)
def test_the_numpy_conv_computes_what_onnxruntime_computes(tmp_path: Path, shape, weight, attrs) -> None:
    from quantune.passes.onnx.rounding import ConvOp

    rng = np.random.default_rng(0)
    x = rng.normal(size=shape).astype(np.float32)
    w = rng.normal(size=weight).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [f"d{i}" for i in range(len(shape))])],
        [numpy_helper.from_array(w, "w")],
    )
    (expected,) = run_model(save_graph(graph, tmp_path / "conv.onnx"), {"x": x})
    op = ConvOp(x, expected, False, attrs, tuple(weight[2:]))
    out = op.forward(op.pool, w, np.zeros(weight[0], np.float32))
    np.testing.assert_allclose(out, op.pool_target, rtol=1e-4, atol=1e-4)
    assert len(out) == expected.size // weight[0]  # every output position


def test_refining_passes_chain(quantized, tmp_path: Path) -> None:
    """static_quant -> bias_correction -> fast_finetune: the second refiner finds the float model too."""
    model, qdq, calib, held_out = quantized
    corrected = _run("bias_correction", {}, qdq, tmp_path, calib)
    tuned = _run("fast_finetune", {"iterations": 100, "learning_rate": 0.02}, corrected, tmp_path, calib)
    assert _error(tuned, model, held_out) < _error(qdq, model, held_out)
