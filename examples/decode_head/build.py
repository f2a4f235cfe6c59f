"""A small anchor-free detector with a YOLOv8-style DFL decode head, built with onnx.helper.

Backbone: three 3x3 Convs. Head: a box Conv (4 sides x 16 distance bins) -> Softmax over the
bins -> a fixed 1x1 Conv with weights 0..15 (DFL: the expected bin) -> Mul by the stride -> Add
of the anchor centres -> Concat with the sigmoid class scores: ``out[N, 4 + 4, anchors]``, box
coordinates in the hundreds next to scores in 0..1. Weights are seeded random; the data is
random too, and ``eval.npz`` holds the float model's own outputs (``ref``) that ``metric.py``
scores detections against (F1, as the issue's detector was scored).

    python examples/decode_head/build.py      # writes model.onnx, calib.npz, eval.npz here
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

SIDE = 16  # input height and width
STRIDE = 4.0  # anchors every 4 pixels after two stride-2 convs
GRID = int(SIDE / STRIDE)
ANCHORS = GRID * GRID
CLASSES = 4
BINS = 16
WIDTH = 32


def build(path: Path, seed: int = 0) -> Path:
    """The detector as an opset-17 model file at ``path``."""
    rng = np.random.default_rng(seed)
    centres = (np.stack(np.meshgrid(np.arange(GRID), np.arange(GRID)), 0).reshape(2, ANCHORS) + 0.5) * STRIDE
    arrays = {
        "w1": rng.normal(0, 0.4, (WIDTH, 3, 3, 3)),
        "b1": rng.normal(0, 0.1, (WIDTH,)),
        "w2": rng.normal(0, 0.08, (WIDTH, WIDTH, 3, 3)),
        "b2": rng.normal(0, 0.1, (WIDTH,)),
        "w3": rng.normal(0, 0.08, (WIDTH, WIDTH, 3, 3)),
        "b3": rng.normal(0, 0.1, (WIDTH,)),
        "wbox": rng.normal(0, 0.3, (4 * BINS, WIDTH, 1, 1)),
        "bbox": rng.normal(0, 0.5, (4 * BINS,)),
        "wcls": rng.normal(0, 0.3, (CLASSES, WIDTH, 1, 1)),
        "bcls": rng.normal(0, 0.5, (CLASSES,)),
        "wdfl": np.arange(BINS, dtype=np.float64).reshape(1, BINS, 1, 1),
        "stride": np.array([STRIDE * 8]),  # distances in pixels of the 8x input the boxes refer to
        "anchors": np.concatenate([centres, centres])[None] * 8,
    }
    shapes = {"shape_box": [0, 4, BINS, ANCHORS], "shape_dist": [0, 4, ANCHORS], "shape_cls": [0, CLASSES, ANCHORS]}
    inits = [numpy_helper.from_array(value.astype(np.float32), name) for name, value in arrays.items()]
    inits += [numpy_helper.from_array(np.array(value, np.int64), name) for name, value in shapes.items()]
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        node("Relu", ["c1"], ["r1"], name="relu1"),
        node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
        node("Relu", ["c2"], ["r2"], name="relu2"),
        node("Conv", ["r2", "w3", "b3"], ["c3"], name="conv3", pads=[1, 1, 1, 1], strides=[2, 2]),
        node("Relu", ["c3"], ["r3"], name="relu3"),
        node("Conv", ["r3", "wbox", "bbox"], ["box"], name="box_conv"),
        node("Reshape", ["box", "shape_box"], ["box4"], name="box_reshape"),
        node("Transpose", ["box4"], ["bins"], name="box_transpose", perm=[0, 2, 1, 3]),
        node("Softmax", ["bins"], ["prob"], name="dfl_softmax", axis=1),
        node("Conv", ["prob", "wdfl"], ["dist"], name="dfl_conv"),
        node("Reshape", ["dist", "shape_dist"], ["dist3"], name="dfl_reshape"),
        node("Mul", ["dist3", "stride"], ["scaled"], name="stride_mul"),
        node("Add", ["scaled", "anchors"], ["coords"], name="anchor_add"),
        node("Conv", ["r3", "wcls", "bcls"], ["cls"], name="cls_conv"),
        node("Reshape", ["cls", "shape_cls"], ["cls3"], name="cls_reshape"),
        node("Sigmoid", ["cls3"], ["scores"], name="cls_sigmoid"),
        node("Concat", ["coords", "scores"], ["out"], name="head_concat", axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "decode_head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, SIDE, SIDE])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4 + CLASSES, ANCHORS])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def inputs(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (rows, 3, SIDE, SIDE)).astype(np.float32)


def write_data(model: Path, folder: Path, calibration_rows: int = 64, evaluation_rows: int = 128) -> dict[str, Path]:
    """``calib.npz`` and ``eval.npz`` (with ``ref``: the float model's outputs) in ``folder``."""
    calib, evaluation = inputs(calibration_rows, 1), inputs(evaluation_rows, 2)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    ref = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"]).run(None, {"x": evaluation})[0]
    np.savez(folder / "calib.npz", x=calib)
    np.savez(folder / "eval.npz", x=evaluation, ref=ref)
    return {"calibration": folder / "calib.npz", "evaluation": folder / "eval.npz"}


if __name__ == "__main__":
    here = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    write_data(build(here / "model.onnx"), here)
