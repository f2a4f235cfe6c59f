"""Peak memory of calibration and sensitivity as the calibration data grows (issue 16).

Builds a detector-like conv net with ``onnx.helper`` (about 2.1M parameters, 1024x1024
input, full-resolution convolutions, so its activations are large: several hundred MB of calibrated
tensors per image), then measures, each in a fresh subprocess (its peak RSS is its lifetime
``ru_maxrss``), calibration with MinMax, Entropy and Percentile and the sensitivity analysis
(``quantune.evaluate.sensitivity.measure``, capture groups sized to the budget) over 1x, 4x
and 16x as many calibration images. Bounded by design, the peak must stay flat (within 20%
of the 1x figure) and under 4 GB.

    PYTHONPATH=src python bench/memory.py [--images 1] [--size 1024] [--budget-mb 512] [--onnx det.onnx]
        [--stages MinMax,Entropy,Percentile,sensitivity] [--scales 1,4,16]

``--onnx`` measures a given model instead, e.g. PP-OCRv6_det_small.onnx from the rapidocr==3.10.0
wheel (``pip download --no-deps rapidocr==3.10.0``; the file is in ``rapidocr/models/``).

``--budget-mb`` is the memory budget the stages chunk by (``QUANTUNE_MEMORY_BUDGET_MB``; in a
run it comes from ``executor.memory_limit_mb`` or a quarter of the machine's memory): it is set
below one image's worth of tensors so the 1x set already needs several chunks.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("MinMax", "Entropy", "Percentile")
SCALES = (1, 4, 16)


def build_detector(path: Path, size: int) -> Path:
    """A DBNet-like shape: full-resolution stem, a strided backbone, upsampled head."""
    rng = np.random.default_rng(0)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def conv(name: str, x: str, cin: int, cout: int, stride: int = 1, relu: bool = True) -> str:
        weight = rng.normal(0, (2 / (cin * 9)) ** 0.5, (cout, cin, 3, 3)).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, f"{name}.w"))
        inits.append(numpy_helper.from_array(np.zeros(cout, np.float32), f"{name}.b"))
        out = f"{name}.out"
        nodes.append(
            helper.make_node(
                "Conv", [x, f"{name}.w", f"{name}.b"], [out], name=name, pads=[1, 1, 1, 1], strides=[stride, stride]
            )
        )
        if not relu:
            return out
        nodes.append(helper.make_node("Relu", [out], [f"{name}.relu"], name=f"{name}_relu"))
        return f"{name}.relu"

    x = conv("stem1", "image", 3, 8)
    x = conv("stem2", x, 8, 8)
    x = conv("down1", x, 8, 32, stride=2)
    x = conv("down2", x, 32, 64, stride=2)
    x = conv("down3", x, 64, 256, stride=2)
    for index in range(3):
        x = conv(f"block{index}", x, 256, 256)
    x = conv("neck", x, 256, 64)
    inits.append(numpy_helper.from_array(np.array([1, 1, 8, 8], np.float32), "scales"))
    nodes.append(helper.make_node("Resize", [x, "", "scales"], ["up"], name="up", mode="nearest"))
    y = conv("head", "up", 64, 1, relu=False)
    nodes.append(helper.make_node("Sigmoid", [y], ["prob"], name="prob"))
    graph = helper.make_graph(
        nodes,
        "detector",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["N", 1, size, size])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _images(count: int, size: int, name: str = "image"):
    """Smooth random 'pages', one per batch, made as they are read (the data is not what is measured)."""
    rng = np.random.default_rng(1)
    for _ in range(count):
        small = rng.normal(0, 1, (1, 3, size // 16, size // 16)).astype(np.float32)
        yield {name: np.repeat(np.repeat(small, 16, axis=2), 16, axis=3)}


def _child(args: argparse.Namespace) -> None:
    """One measurement in this fresh process; prints its figures as JSON."""
    from onnxruntime.quantization import CalibrationMethod

    started = time.perf_counter()
    if args.child == "sensitivity":
        from quantune.evaluate.sensitivity import measure
        from quantune.memory import return_large_blocks

        return_large_blocks()  # as the sensitivity stage's worker does

        report = measure(args.model, args.quant, lambda: _images(args.count, args.size, args.input))
        detail = {"rows": report.rows}
    else:
        from quantune.passes.onnx.calibration import calibrate_ranges

        feeds = lambda: _images(args.count, args.size, args.input)  # noqa: E731
        ranges = calibrate_ranges(args.model, feeds, CalibrationMethod[args.child])
        detail = {"tensors": len(list(ranges))}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"peak_mb": peak, "seconds": time.perf_counter() - started, **detail}))


def _input_name(model: Path) -> str:
    return onnx.load(str(model), load_external_data=False).graph.input[0].name


def _measure(kind: str, model: Path, quant: Path, count: int, size: int, budget: float) -> dict:
    command = [sys.executable, __file__, "--child", kind, "--model", str(model), "--quant", str(quant)]
    command += ["--count", str(count), "--size", str(size), "--input", _input_name(model)]
    env = {**os.environ, "QUANTUNE_MEMORY_BUDGET_MB": str(budget), "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _quantize(model: Path, quant: Path, size: int) -> None:
    """The QDQ model sensitivity compares with (MinMax on two images), built in a subprocess too."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[4]); from memory import _images;"
        "from onnxruntime.quantization import quantize_static, QuantFormat, CalibrationDataReader\n"
        "class R(CalibrationDataReader):\n"
        "    def __init__(self): self.it = _images(2, int(sys.argv[3]), sys.argv[5])\n"
        "    def get_next(self): return next(self.it, None)\n"
        "quantize_static(sys.argv[1], sys.argv[2], R(), quant_format=QuantFormat.QDQ)"
    )
    here = str(Path(__file__).parent)
    subprocess.run(
        [sys.executable, "-c", code, str(model), str(quant), str(size), here, _input_name(model)], check=True
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=1, help="calibration images at 1x")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--budget-mb", type=float, default=512)
    parser.add_argument("--onnx", type=Path, help="measure this model (one image input [N, 3, H, W]) instead")
    parser.add_argument("--scales", default=",".join(map(str, SCALES)), help="data sizes, as multiples of --images")
    parser.add_argument("--stages", default=",".join((*METHODS, "sensitivity")), help="comma-separated subset")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--quant", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--input", default="image", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return 0
    with tempfile.TemporaryDirectory(prefix="quantune-bench-memory-") as tmp:
        model = args.onnx.resolve() if args.onnx else build_detector(Path(tmp) / "detector.onnx", args.size)
        quant = Path(tmp) / "detector.qdq.onnx"
        _quantize(model, quant, args.size)
        params = sum(int(np.prod(i.dims)) for i in onnx.load(str(model)).graph.initializer)
        print(
            f"{model.name}: {params / 1e6:.2f}M parameters, {model.stat().st_size / 2**20:.1f} MB, input 3x{args.size}x{args.size}"
        )
        print(f"memory budget {args.budget_mb:.0f} MB; peak RSS of a fresh process per cell (MB)\n")
        scales = [int(s) for s in args.scales.split(",")]
        header = f"| stage | {' | '.join(f'{s}x ({s * args.images} img)' for s in scales)} | last / first | flat (<=1.2) and < 4 GB |"
        print(header)
        print("|" + " --- |" * (len(scales) + 3), flush=True)
        ok = True
        for kind in args.stages.split(","):
            cells = []
            for scale in scales:
                cells.append(_measure(kind, model, quant, scale * args.images, args.size, args.budget_mb))
                print(f"<!-- {kind} {scale}x: {json.dumps(cells[-1])} -->", file=sys.stderr, flush=True)
            if any("error" in c for c in cells):
                print(
                    f"| {kind} | "
                    + " | ".join(c.get("error", f"{c.get('peak_mb', 0):.0f}") for c in cells)
                    + " | | failed |"
                )
                ok = False
                continue
            peaks = [c["peak_mb"] for c in cells]
            ratio = peaks[-1] / peaks[0]
            good = ratio <= 1.2 and max(peaks) < 4096
            ok &= good
            times = ", ".join(f"{c['seconds']:.0f}s" for c in cells)
            print(
                f"| {kind} | "
                + " | ".join(f"{p:.0f}" for p in peaks)
                + f" | {ratio:.2f} | {'yes' if good else 'NO'} ({times}) |",
                flush=True,
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
