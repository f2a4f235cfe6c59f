"""A heavier built model whose sensitivity stage is costly: raw audio through a lead-in and a conv stack.

    python bench/sensitivity_cost.py OUT_DIR [--samples 16384] [--rows 64] [--time N]
    quantune run OUT_DIR/config.yaml --output /tmp/run --set cache_dir=/tmp/cache

Writes ``model.onnx`` (x[N, samples] -> Reshape -> Pad (reflect) -> Slice (drops a loud tail)
-> 8 strided Conv1d + Relu -> ReduceMean -> Gemm -> 10 logits), ``calib.npz``, ``eval.npz``
(quiet samples ~1e-3, a loud tail ~1e2 the model slices off: int8 on the lead-in breaks it, as
on an audio model's framing) and ``config.yaml`` (cosine to the float model's outputs, 1%
relative loss, latency). The run's ``time_spent_s['sensitivity']`` over its ``original`` and
the sensitivity worker's log line (``N rows, X whole-model runs of a row each``) give the
stage's cost in evaluations of the original; ``strategy.sensitivity`` gives the ranking.
``--time N``: N interleaved rounds, each timing one evaluation of the original (one thread, the
config's batch) and the static measurement with and without its bound (the engine's
``EVALUATIONS``), against the QDQ model the probe measures; prints the medians and the ranking.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CONFIG = """model: model.onnx
data:
  calibration: calib.npz
  evaluation: eval.npz
  batch_size: 16
evaluation:
  metric: cosine
  latency: {warmup: 2, repeats: 10, threads: 1}
criterion:
  type: relative
  tolerable_loss: 0.01
objective: latency
passes:
  - name: static_quant
    params: {quant_format: QDQ, activation_type: uint8, weight_type: int8, per_channel: false}
search:
  strategy: quantune
  seed: 0
stop:
  max_trials: 8
"""


def build(path: Path, samples: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    tail = samples // 64
    inits = [
        numpy_helper.from_array(np.array(v, np.int64), k)
        for k, v in {
            "shape": [-1, 1, samples],
            "pads": [0, 0, 4, 0, 0, 4],
            "starts": [0],
            "ends": [samples - tail],
            "axes": [2],
            "mean_axes": [2],
        }.items()
    ]
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="frame_reshape"),
        helper.make_node("Pad", ["r", "pads"], ["pd"], name="frame_pad", mode="reflect"),
        helper.make_node("Slice", ["pd", "starts", "ends", "axes"], ["h0"], name="frame_slice"),
    ]
    channels = [1, 32, 32, 48, 48, 64, 64, 64, 64]
    for i in range(1, len(channels)):
        w = rng.normal(0, 1 / np.sqrt(channels[i - 1] * 5), (channels[i], channels[i - 1], 5)).astype(np.float32)
        inits += [
            numpy_helper.from_array(w, f"w{i}"),
            numpy_helper.from_array(np.zeros(channels[i], np.float32), f"b{i}"),
        ]
        stride = 2 if i % 2 else 1
        nodes.append(
            helper.make_node(
                "Conv", [f"h{i - 1}", f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[2, 2], strides=[stride]
            )
        )
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"h{i}"], name=f"relu{i}"))
    last = len(channels) - 1
    inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (channels[-1], 10)).astype(np.float32), "fc"))
    nodes.append(helper.make_node("ReduceMean", [f"h{last}", "mean_axes"], ["pooled"], name="pool", keepdims=0))
    nodes.append(helper.make_node("MatMul", ["pooled", "fc"], ["y"], name="classifier"))
    graph = helper.make_graph(
        nodes,
        "audio",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", samples])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


def audio(rows: int, samples: int, seed: int) -> np.ndarray:
    """Quiet samples (~1e-3 with a slow tone) and a loud tail (~1e2) the model slices off."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples)
    x = 1e-3 * (
        np.sin(2 * np.pi * t[None, :] * rng.uniform(0.001, 0.02, (rows, 1))) + rng.normal(0, 0.3, (rows, samples))
    )
    x[:, samples - samples // 64 :] = rng.normal(0, 50, (rows, samples // 64))
    return x.astype(np.float32)


def timed(folder: Path, rounds: int) -> None:
    import time

    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from quantune.engine.measure.sensitivity_probe import EVALUATIONS
    from quantune.evaluate.sensitivity import measure

    x, c = np.load(folder / "eval.npz")["x"], np.load(folder / "calib.npz")["x"]

    def batches(data: np.ndarray) -> list[dict[str, np.ndarray]]:
        return [{"x": data[i : i + 16]} for i in range(0, len(data), 16)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(batches(c))

        def get_next(self):
            return next(self.items, None)

    quant = folder / "q.onnx"
    kinds = {"activation_type": QuantType.QUInt8, "weight_type": QuantType.QInt8}
    quantize_static(str(folder / "model.onnx"), str(quant), Reader(), quant_format=QuantFormat.QDQ, **kinds)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    original = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
    seconds: dict[str, list[float]] = {"evaluation": [], "bounded": [], "unbounded": []}
    reports = {}
    for _ in range(rounds):
        started = time.perf_counter()
        for feed in batches(x):
            original.run(None, feed)
        seconds["evaluation"].append(time.perf_counter() - started)
        for kind, bound in (("bounded", EVALUATIONS * len(x)), ("unbounded", None)):
            started = time.perf_counter()
            reports[kind] = measure(folder / "model.onnx", quant, batches(c), row_runs=bound)
            seconds[kind].append(time.perf_counter() - started)
    evaluation = float(np.median(seconds["evaluation"]))
    print(f"one evaluation of the original ({len(x)} rows): {evaluation:.2f} s (median of {rounds})")
    for kind in ("bounded", "unbounded"):
        report, median = reports[kind], float(np.median(seconds[kind]))
        top = sorted(report.scores, key=report.scores.get, reverse=True)[:3]
        print(f"{kind}: {report.rows} rows, {median:.2f} s = {median / evaluation:.1f} evaluations; top {top}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--time", type=int, default=0, help="interleaved timing rounds (0: build only)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    build(args.out / "model.onnx", args.samples)
    np.savez(args.out / "calib.npz", x=audio(args.rows, args.samples, 1))
    np.savez(args.out / "eval.npz", x=audio(args.rows, args.samples, 2))
    (args.out / "config.yaml").write_text(CONFIG)
    print(f"wrote {args.out}/model.onnx, calib.npz, eval.npz ({args.rows} rows of {args.samples} samples), config.yaml")
    if args.time:
        timed(args.out, args.time)


if __name__ == "__main__":
    main()
