"""Bias correction and fast fine-tuning (AdaRound, AdaQuant) where plain int8 misses the budget.

    python bench/finetune.py [--model examples/scaled_cnn/model.onnx] [--out bench/results]

Quantizes the scaled CNN (the digits CNN with four channels scaled x120: plain per-tensor
int8 loses several points) with ``static_quant`` (QDQ, MinMax, uint8 activations, per-tensor
and per-channel weights), then runs ``bias_correction`` and ``fast_finetune`` (adaround,
adaquant) on each, and prints top-1 on the digits evaluation data against fp32, with the
time each pass took. The passes run exactly as in a flow (same classes, same calibration).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from quantune.data import Dataset
from quantune.model import file_sha256
from quantune.passes import get_pass
from quantune.passes.base import PassContext

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "examples" / "digits"


def top1(model: Path, data: dict[str, np.ndarray]) -> float:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"input": data["input"]})
    return float(np.mean(np.argmax(logits, axis=1) == data["label"]))


def run_pass(
    name: str, params: dict, model_in: Path, folder: Path, calibration: Dataset, cache: Path
) -> tuple[Path, tuple[float, float]]:
    """Runs one pass as a flow step would; returns its output and (wall, CPU) seconds."""
    pass_cls = get_pass(name)
    config = pass_cls.Config.model_validate(params)
    out = folder / f"{name}-{len(list(folder.iterdir()))}.onnx"
    context = PassContext(calibration, ["input"], 64, folder, file_sha256(model_in), cache / "passes" / name)
    start, cpu = time.perf_counter(), time.process_time()
    pass_cls().run(config, model_in, out, context)
    return out, (time.perf_counter() - start, time.process_time() - cpu)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=str(ROOT / "examples" / "scaled_cnn" / "model.onnx"))
    parser.add_argument("--out", default=None, help="folder for a JSON + Markdown record")
    args = parser.parse_args()
    calib = dict(np.load(DIGITS / "calib.npz"))
    evaluation = dict(np.load(DIGITS / "eval.npz"))
    calibration = Dataset({"input": calib["input"]}, "calib")
    model = Path(args.model)
    fp32 = top1(model, evaluation)
    rows: list[dict] = [{"model": "fp32", "top1": fp32, "loss_pct": 0.0, "seconds": 0.0, "cpu_seconds": 0.0}]
    with tempfile.TemporaryDirectory(prefix="quantune-ft-") as tmp:
        folder, cache = Path(tmp) / "models", Path(tmp) / "cache"
        folder.mkdir()
        for per_channel in (False, True):
            label = "per-channel" if per_channel else "per-tensor"
            qdq, seconds = run_pass("static_quant", {"per_channel": per_channel}, model, folder, calibration, cache)
            variants = [(f"static_quant {label}", qdq, seconds)]
            for name, params in (
                ("bias_correction", {}),
                ("fast_finetune", {"optim": "adaround"}),
                ("fast_finetune", {"optim": "adaquant"}),
            ):
                out, spent = run_pass(name, params, qdq, folder, calibration, cache)
                variants.append((f"  + {name} {params.get('optim', '')}".rstrip(), out, spent))
            for text, path, spent in variants:
                accuracy = top1(path, evaluation)
                loss = 100 * (fp32 - accuracy) / fp32
                rows.append(
                    {"model": text, "top1": accuracy, "loss_pct": loss, "seconds": spent[0], "cpu_seconds": spent[1]}
                )
    lines = ["| model | top-1 | loss vs fp32 | pass wall s | pass CPU s |", "| --- | --- | --- | --- | --- |"]
    lines += [
        f"| {r['model']} | {r['top1']:.4f} | {r['loss_pct']:.2f}% | {r['seconds']:.1f} | {r['cpu_seconds']:.1f} |"
        for r in rows
    ]
    print("\n".join(lines))
    if args.out:
        stamp = time.strftime("%Y-%m-%d-%H%M", time.gmtime())
        out = Path(args.out)
        (out / f"finetune-{stamp}.json").write_text(json.dumps({"model": str(model), "rows": rows}, indent=1))
        (out / f"finetune-{stamp}.md").write_text(
            f"# bias correction / fast fine-tune on {model.name}\n\n`python bench/finetune.py --out bench/results` "
            f"(1 thread, 2-core machine shared with other jobs)\n\n" + "\n".join(lines) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
