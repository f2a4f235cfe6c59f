"""Builds a CNN on which naive int8 fails by construction, for fast accuracy-tuning tests.

The model computes exactly what the digits CNN (``../digits/model.onnx``) computes: its
weights are copied, then a few output channels of the second conv are scaled up by ``SCALE``
and the matching input channels of the next conv are scaled down by ``SCALE``. ReLU and
MaxPool are positively homogeneous per channel (``f(a*x) = a*f(x)`` for ``a > 0``), so the
float function is unchanged, but one per-tensor int8 scale can no longer cover both the
scaled and the ordinary channels: the ordinary ones lose almost all their resolution (and
the scaled-down weights of the next conv round to zero). Fallback of the two convs, or
cross-layer equalization, recovers the accuracy.

Run ``python examples/scaled_cnn/build.py`` (numpy + onnx only); it checks both claims.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent / "digits" / "model.onnx"
SCALE = 120.0
SCALED_CHANNELS = (0, 1, 2, 3)  # output channels of features.2 (inputs of features.5)
UP, DOWN = "features.2", "features.5"


def build(source: Path = SOURCE, target: Path = HERE / "model.onnx", scale: float = SCALE) -> Path:
    """Writes the scaled model to ``target`` and returns its path."""
    model = onnx.load(str(source))
    inits = {init.name: init for init in model.graph.initializer}
    channels = list(SCALED_CHANNELS)

    def replace(name: str, array: np.ndarray) -> None:
        inits[name].CopyFrom(numpy_helper.from_array(array.astype(np.float32), name))

    up_w = numpy_helper.to_array(inits[f"{UP}.weight"]).copy()
    up_b = numpy_helper.to_array(inits[f"{UP}.bias"]).copy()
    down_w = numpy_helper.to_array(inits[f"{DOWN}.weight"]).copy()
    up_w[channels] *= scale
    up_b[channels] *= scale
    down_w[:, channels] /= scale
    replace(f"{UP}.weight", up_w)
    replace(f"{UP}.bias", up_b)
    replace(f"{DOWN}.weight", down_w)
    model.graph.name = "scaled_cnn"
    onnx.checker.check_model(model)
    onnx.save(model, str(target))
    return target


def _check(target: Path) -> None:
    """fp32 outputs match the digits CNN's on its evaluation data."""
    import onnxruntime as ort

    data = np.load(HERE.parent / "digits" / "eval.npz")
    feeds = {"input": data["input"]}
    ref = ort.InferenceSession(str(SOURCE), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    out = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    same = float(np.mean(ref.argmax(1) == out.argmax(1)))
    print(f"max |diff| vs digits: {np.abs(ref - out).max():.2e}; top-1 agreement {same:.4f}")
    if same != 1.0:
        sys.exit("the scaled model does not compute the digits CNN's function")


if __name__ == "__main__":
    _check(build())
