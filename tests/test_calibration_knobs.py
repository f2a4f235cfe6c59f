"""static_quant's onnxruntime knobs: each reaches onnxruntime and changes the model; the chunked
moving-average calibration gives onnxruntime's own one-call (and strided) ranges."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
from pydantic import ValidationError

from conftest import build_cnn, cnn_inputs, save_graph
from quantune.data import CalibrationReader, Dataset
from quantune.passes import PassContext, get_pass
from quantune.passes.onnx.calibration import calibrate_ranges

StaticConfig = get_pass("static_quant").Config


def _quantize(model: Path, out: Path, rows: dict[str, np.ndarray], batch: int = 16, **params) -> onnx.ModelProto:
    context = PassContext(Dataset(rows, "calib"), list(rows), batch, out.parent)
    get_pass("static_quant")().run(StaticConfig.model_validate(params), model, out, context)
    return onnx.load(str(out))


def _scales(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {
        i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.name.endswith(("_scale", "_zero_point"))
    }


def _inits(model: onnx.ModelProto) -> set[str]:
    return {init.name for init in model.graph.initializer}


def _ops(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


def build_fork(path: Path) -> Path:
    """``x`` read by two MatMuls (a shared QDQ pair, or one each), a MatMul of two activations,
    and a Transpose of the input (quantized only when forced)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (8, 8)).astype(np.float32), n) for n in ("wa", "wb")]
    nodes = [
        helper.make_node("MatMul", ["x", "wa"], ["a"], name="mm_a"),
        helper.make_node("MatMul", ["x", "wb"], ["b"], name="mm_b"),
        helper.make_node("Transpose", ["b"], ["bt"], name="tr", perm=[1, 0]),
        helper.make_node("MatMul", ["a", "bt"], ["y"], name="mm_ab"),
        helper.make_node("Abs", ["x"], ["ax"], name="abs"),
        helper.make_node("Transpose", ["ax"], ["xt"], name="tr_x", perm=[1, 0]),
    ]
    graph = helper.make_graph(
        nodes,
        "fork",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4]),
            helper.make_tensor_value_info("xt", TensorProto.FLOAT, [8, 4]),
        ],
        inits,
    )
    return save_graph(graph, path)


CNN_OPTIONS = [
    ("keep_removable_activations", True, lambda m: "Relu" in _ops(m)),
    (
        "add_qdq_pair_to_weight",
        True,
        lambda m: any(n.op_type == "QuantizeLinear" and n.input[0] in _inits(m) for n in m.graph.node),
    ),
    ("quantize_bias", False, lambda m: not any(i.data_type == TensorProto.INT32 for i in m.graph.initializer)),
    ("activation_restricted_asymmetric", True, None),
    ("minimum_real_range", 50.0, None),
    ("calib_tensor_range_symmetric", True, None),
    ("calib_moving_average", True, None),
]


@pytest.mark.parametrize(("field", "value", "check"), CNN_OPTIONS, ids=[c[0] for c in CNN_OPTIONS])
def test_each_cnn_option_reaches_onnxruntime_and_changes_the_model(tmp_path: Path, field, value, check) -> None:
    model = build_cnn(tmp_path / "cnn.onnx")
    rows = {"input": cnn_inputs(64, seed=1)}
    plain = _quantize(model, tmp_path / "plain.onnx", rows)
    changed = _quantize(model, tmp_path / "changed.onnx", rows, **{field: value})
    assert changed.SerializeToString() != plain.SerializeToString()
    if check is not None:
        assert check(changed) and not check(plain)
    else:  # a calibration or scale option: the quantization parameters moved
        assert any(not np.array_equal(v, _scales(plain).get(k)) for k, v in _scales(changed).items())


# (option, format it acts in, a count it raises); onnxruntime 1.32 applies the last two in QOperator only
FORK_OPTIONS = [
    ("dedicated_qdq_pair", "QDQ", lambda m: _ops(m).count("DequantizeLinear")),
    ("force_quantize_no_input_check", "QOperator", lambda m: _ops(m).count("QuantizeLinear")),
    ("matmul_const_b_only", "QOperator", lambda m: -_ops(m).count("QLinearMatMul")),
]


@pytest.mark.parametrize(("field", "quant_format", "count"), FORK_OPTIONS, ids=[c[0] for c in FORK_OPTIONS])
def test_each_graph_option_reaches_onnxruntime(tmp_path: Path, field, quant_format, count) -> None:
    model = build_fork(tmp_path / "fork.onnx")
    rows = {"x": np.random.default_rng(1).normal(0, 1, (4, 8)).astype(np.float32)}
    plain = _quantize(model, tmp_path / "plain.onnx", rows, batch=4, quant_format=quant_format)
    changed = _quantize(model, tmp_path / "changed.onnx", rows, batch=4, quant_format=quant_format, **{field: True})
    assert count(changed) > count(plain)


@pytest.mark.parametrize(("stride", "constant", "symmetric"), [(None, 0.01, False), (2, 0.3, True), (3, 0.5, False)])
def test_chunked_moving_average_gives_onnxruntimes_own_ranges(tmp_path: Path, stride, constant, symmetric) -> None:
    """Batches of very different ranges, so the one-call mean, the strides' moving average and
    a per-batch (wrong) merge all differ: the model equals onnxruntime's own calibration's."""
    model = build_cnn(tmp_path / "cnn.onnx")
    rows = np.concatenate([cnn_inputs(16, seed=s) * (1 + 3 * s) for s in range(6)])
    data = Dataset({"input": rows}, "calib")
    params = {"calib_moving_average": True, "calib_tensor_range_symmetric": symmetric}
    extra = {"CalibMovingAverage": True, "CalibTensorRangeSymmetric": symmetric}
    if stride is not None:
        params |= {"calib_strided_minmax": stride, "calib_moving_average_constant": constant}
        extra |= {"CalibStridedMinMax": stride, "CalibMovingAverageConstant": constant}
    ours = _quantize(model, tmp_path / "ours.onnx", {"input": rows}, **params)
    with contextlib.redirect_stdout(io.StringIO()):
        quantize_static(
            str(model),
            str(tmp_path / "ort.onnx"),
            CalibrationReader(data, ["input"], 16, None),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            extra_options={"ActivationSymmetric": False, "WeightSymmetric": True, **extra},
        )
    theirs = _scales(onnx.load(str(tmp_path / "ort.onnx")))
    for name, value in _scales(ours).items():
        np.testing.assert_allclose(value, theirs[name], rtol=1e-5, err_msg=name)
    global_minmax = calibrate_ranges(model, lambda: data.batches(["input"], 16), CalibrationMethod.MinMax)
    averaged = calibrate_ranges(
        model,
        lambda: data.batches(["input"], 16),
        CalibrationMethod.MinMax,
        options={"moving_average": True, "averaging_constant": constant},
        stride=stride,
    )
    name = next(iter(averaged.keys()))
    assert averaged[name].range_value[1] < global_minmax[name].range_value[1]  # outlier batches no longer set it


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"calib_moving_average": True, "calibrate_method": "Entropy"}, "MinMax"),
        ({"calib_strided_minmax": 2}, "calib_moving_average"),
        ({"calib_moving_average": True, "calib_moving_average_constant": 0.2}, "calib_strided_minmax"),
        ({"keep_removable_activations": True, "quant_format": "QOperator"}, "QDQ"),
        ({"activation_restricted_asymmetric": True, "activation_type": "int8"}, "uint8"),
    ],
)
def test_combinations_onnxruntime_ignores_are_refused(params: dict, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        StaticConfig.model_validate(params)


def test_knobs_are_searchable_and_pruned_where_onnxruntime_ignores_them(tmp_path: Path) -> None:
    from quantune.config import Config
    from quantune.engine.plan.plan import build_plan

    search = {"search": {"when": "calibrate_method", "cases": {"MinMax": [False, True]}}}
    params = {"calibrate_method": {"search": ["MinMax", "Entropy"]}, "calib_moving_average": search}
    params["keep_removable_activations"] = {"search": [False, True]}
    params["quant_format"] = {"search": ["QDQ", "QOperator"]}
    data = {"calibration": "c.npz", "evaluation": "e.npz"}
    config = Config.model_validate(
        {"model": str(tmp_path / "m.onnx"), "data": data, "passes": [{"name": "static_quant", "params": params}]}
    )
    points = list(build_plan(config).space.iterate())
    assert len(points) == 9  # (MinMax x 2 + Entropy) x (QDQ x 2 + QOperator)
    assert not any(
        p.get("static_quant.calib_moving_average") and p["static_quant.calibrate_method"] != "MinMax" for p in points
    )
    assert "calib_moving_average" not in get_pass("static_quant").search_space  # default spaces unchanged


def test_calibration_cache_keys_change_with_the_calibration_options_only(tmp_path: Path) -> None:
    static = get_pass("static_quant")
    context = PassContext(Dataset({"input": cnn_inputs(8, 1)}, "c"), ["input"], 8, tmp_path, "sha", tmp_path / "cache")
    key = lambda **p: static._calibration_cache(StaticConfig.model_validate(p), context)[0]  # noqa: E731
    assert key() == key(keep_removable_activations=True)  # a model option: same ranges
    assert key() != key(calib_moving_average=True) != key(calib_moving_average=True, calib_strided_minmax=2)
    assert key() != key(calib_tensor_range_symmetric=True)
