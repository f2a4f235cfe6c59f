"""A small model with one fragile part: a LayerNorm decomposed into elementwise ops before a MatMul MLP.

Its input rows differ in scale by three orders of magnitude. The float LayerNorm normalises
them, so the MatMuls after it see well-scaled rows and quantize fine; quantize the LayerNorm's
own ops (ReduceMean, Sub, Pow, Sqrt, Div, ...) and the small rows fall below one quantization
step of the large ones and are lost -- the pattern of the issue's transformer classifier, where
Neural Compressor kept the decomposed LayerNorms in float and quantized the MatMuls.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from conftest import run_model, save_graph

FEATURES = 32
HIDDEN = 64
CLASSES = 6
LAYERNORM_TYPES = frozenset({"ReduceMean", "Sub", "Pow", "Sqrt", "Div", "Mul", "Add"})


def build_layernorm_mlp(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    arrays = {
        "two": np.array(2.0),
        "eps": np.array(1e-5),
        "gamma": rng.uniform(0.8, 1.2, FEATURES),
        "beta": rng.normal(0, 0.1, FEATURES),
        "w1": rng.normal(0, 0.3, (FEATURES, HIDDEN)),
        "w2": rng.normal(0, 0.3, (HIDDEN, CLASSES)),
    }
    inits = [numpy_helper.from_array(np.asarray(v, dtype=np.float32), n) for n, v in arrays.items()]
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], name="ln/mean", axes=[-1]),
        helper.make_node("Sub", ["x", "mean"], ["centered"], name="ln/sub"),
        helper.make_node("Pow", ["centered", "two"], ["squared"], name="ln/pow"),
        helper.make_node("ReduceMean", ["squared"], ["variance"], name="ln/var", axes=[-1]),
        helper.make_node("Add", ["variance", "eps"], ["variance_eps"], name="ln/add_eps"),
        helper.make_node("Sqrt", ["variance_eps"], ["std"], name="ln/sqrt"),
        helper.make_node("Div", ["centered", "std"], ["normed"], name="ln/div"),
        helper.make_node("Mul", ["normed", "gamma"], ["scaled"], name="ln/mul_gamma"),
        helper.make_node("Add", ["scaled", "beta"], ["ln_out"], name="ln/add_beta"),
        helper.make_node("MatMul", ["ln_out", "w1"], ["h"], name="mlp/fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="mlp/relu"),
        helper.make_node("MatMul", ["r", "w2"], ["logits"], name="mlp/fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "layernorm_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])],
        inits,
    )
    return save_graph(graph, path)


def layernorm_inputs(rows: int, seed: int) -> np.ndarray:
    """Rows N(0, 1) times a per-row scale in [0.01, 10] (log-uniform), plus a per-row offset."""
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.uniform(-2, 1, (rows, 1))
    offset = rng.normal(0, 1, (rows, 1)) * scale
    return (rng.normal(0, 1, (rows, FEATURES)) * scale + offset).astype(np.float32)


def layernorm_data(folder: Path, model: Path) -> dict[str, Path]:
    """calib.npz and eval.npz (labels: the fp32 model's own predictions, so the baseline top1 is 1.0)."""
    calib, evaluation = layernorm_inputs(128, seed=1), layernorm_inputs(200, seed=2)
    labels = np.argmax(run_model(model, {"x": evaluation})[0], axis=1).astype(np.int64)
    np.savez(folder / "ln_calib.npz", x=calib)
    np.savez(folder / "ln_eval.npz", x=evaluation, label=labels)
    return {"calibration": folder / "ln_calib.npz", "evaluation": folder / "ln_eval.npz"}
