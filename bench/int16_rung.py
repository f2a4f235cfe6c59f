"""Is a 16-bit-activation unit a rung between int8 and fp32 on onnxruntime's CPU provider?

Issue 25 asks for int16 activations on just the worst units as a cheaper fix than fp32, but
only where it is faster than leaving the unit in fp32. This builds a small conv net (four 3x3
convs, 32 channels, 56x56), quantizes it with onnxruntime's quantize_static (QDQ, uint8
activations, per-channel int8 weights) three ways -- every conv int8; the second conv in fp32
(``nodes_to_exclude``); the second conv's input and output int16 (``TensorQuantOverrides``,
``UseQDQContribOps``) -- and times them interleaved, one thread, under the shared latency lock::

    PYTHONPATH=$PWD/src python bench/int16_rung.py [--repeats 200]

Prints a table of median latency and ratio to the all-int8 model.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

sys.path.insert(0, str(Path(__file__).parent))
from common import latency_interleaved

from quantune.evaluate.latency import latency_lane

CHANNELS, SIZE, LAYERS = 32, 56, 4


def build(path: Path) -> None:
    rng = np.random.default_rng(0)
    nodes, inits, current = [], [], "x"
    for i in range(LAYERS):
        cin = 3 if i == 0 else CHANNELS
        inits += [
            numpy_helper.from_array(rng.normal(0, 0.2, (CHANNELS, cin, 3, 3)).astype(np.float32), f"w{i}"),
            numpy_helper.from_array(rng.normal(0, 0.1, CHANNELS).astype(np.float32), f"b{i}"),
        ]
        nodes += [
            helper.make_node("Conv", [current, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        current = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, [1, CHANNELS, SIZE, SIZE])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


class Reader(CalibrationDataReader):
    def __init__(self) -> None:
        rng = np.random.default_rng(1)
        self.rows = iter([{"x": rng.normal(0, 1, (1, 3, SIZE, SIZE)).astype(np.float32)} for _ in range(8)])

    def get_next(self) -> dict | None:
        return next(self.rows, None)


def quantize(model: Path, out: Path, exclude: list[str], overrides: dict) -> Path:
    extra: dict = {}
    if overrides:
        extra = {"TensorQuantOverrides": overrides, "UseQDQContribOps": True}
    quantize_static(
        str(model),
        str(out),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        nodes_to_exclude=exclude,
        extra_options=extra,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = folder / "fp32.onnx"
        build(model)
        wide = [{"quant_type": QuantType.QUInt16}]
        models = {
            "fp32 (original)": model,
            "all int8": quantize(model, folder / "int8.onnx", [], {}),
            "conv1 fp32": quantize(model, folder / "fp32unit.onnx", ["conv1"], {}),
            "conv1 int16 activations": quantize(model, folder / "int16unit.onnx", [], {"r0": wide, "c1": wide}),
        }
        feeds = {"x": np.random.default_rng(2).normal(0, 1, (1, 3, SIZE, SIZE)).astype(np.float32)}
        with latency_lane():
            timed = latency_interleaved(models, feeds, warmup=20, repeats=args.repeats)
    base = timed["all int8"]["latency_ms"]
    print(f"load average {os.getloadavg()[0]:.1f}; onnxruntime CPU, 1 thread, {args.repeats} interleaved rounds")
    print("| model | median ms | vs all int8 |\n| --- | --- | --- |")
    for name, entry in timed.items():
        print(f"| {name} | {entry['latency_ms']:.3f} | {entry['latency_ms'] / base:.2f}x |")


if __name__ == "__main__":
    main()
