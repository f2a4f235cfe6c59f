"""quantune's dynamic model against Neural Compressor 2.6's default (first) dynamic model, weight by weight.

    python bench/nc_equal.py [--peers DIR] [--models minilm_l3,captcha_ddddocr]

For each zoo model: the model as quantune prepares it (the zoo config through ``build_run``, a
private cache), quantized by the ``dynamic_quant`` pass with Neural Compressor's settings
(per_channel, reduce_range, pre_optimize extended; weight_type int8 for MiniLM, mixed for the
captcha model), then compared with NC's model from a peers run (``inc-mse_v2-dynamic``):
which of NC's quantized initializers (``*_quantized``, their scales and zero points) quantune's
model holds byte for byte, the file sizes, and the zoo metric of fp32, NC and quantune on the
zoo's evaluation data (outputs only: nothing is timed). Needs the zoo built
(``python bench/zoo/run.py --build-only``) and a peers run holding NC's models.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench" / "zoo"))

from zoolib import CACHE  # noqa: E402

PEERS = Path.home() / ".cache" / "quantune-bench" / "runs" / "peers-2026-11-23-0343"
WEIGHT_TYPES = {"minilm_l3": "int8", "captcha_ddddocr": "mixed"}


def initializers(path: Path) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}


def compare(ours: Path, theirs: Path) -> dict[str, object]:
    """NC's quantized weights (and their scales / zero points) that quantune's model holds byte for byte.

    onnxruntime names a Gemm's weight ``<w>_Transposed`` (it rewrites the Gemm into a MatMul
    first), NC keeps ``<w>``: the two names are the same weight.
    """
    a, b = initializers(ours), initializers(theirs)
    weights = [name for name in b if name.endswith("_quantized")]
    same, differ, matched = [], [], set()
    for name in weights:
        base = name[: -len("_quantized")]
        mine = next((c for c in (base, f"{base}_Transposed") if f"{c}_quantized" in a), base)
        pairs = [(f"{mine}{s}", f"{base}{s}") for s in ("_quantized", "_scale", "_zero_point") if f"{base}{s}" in b]
        equal = all(
            x in a and a[x].dtype == b[y].dtype and a[x].shape == b[y].shape and a[x].tobytes() == b[y].tobytes()
            for x, y in pairs
        )
        (same if equal else differ).append(name)
        matched.add(f"{mine}_quantized")
    ours_only = [name for name in a if name.endswith("_quantized") and name not in matched]
    ops_a, ops_b = op_counts(ours), op_counts(theirs)
    op_diff = {
        op: (ops_a.get(op, 0), ops_b.get(op, 0))
        for op in sorted(set(ops_a) | set(ops_b))
        if ops_a.get(op, 0) != ops_b.get(op, 0)
    }
    return {
        "nc_quantized_weights": len(weights),
        "identical": len(same),
        "differ": differ,
        "quantune_only": ours_only,
        "op_counts_quantune_vs_nc": op_diff,
    }


def op_counts(path: Path) -> dict[str, int]:
    return dict(Counter(node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node))


def build(name: str, work: Path) -> tuple[Path, Path, object]:
    """(original, quantune's dynamic model, run parts) for zoo model ``name``."""
    from quantune.config import load_config
    from quantune.engine.trials.setup import build_run
    from quantune.passes import PassContext, get_pass

    config = CACHE / name / "zoo-run.yaml"
    if not config.is_file():
        sys.exit(f"{config}: missing; run python bench/zoo/run.py --models {name} once (it writes it)")
    parts = build_run(load_config(config))
    prepared = parts.context.prepared.path
    pass_cls = get_pass("dynamic_quant")
    settings = {"weight_type": WEIGHT_TYPES[name], "per_channel": True, "reduce_range": True}
    out = work / f"{name}-quantune.onnx"
    context = PassContext(None, parts.context.prepared.input_names(), 1, work)
    pass_cls().run(pass_cls.Config(pre_optimize="extended", **settings), prepared, out, context)
    return parts.context.model.path, out, parts


def metric(parts: object, model: Path) -> float:
    from quantune.evaluate.evaluator import _call_user_metric

    evaluator = parts.context.evaluator  # type: ignore[attr-defined]
    return _call_user_metric(evaluator.spec, evaluator.outputs(model), evaluator.dataset)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=Path, default=PEERS, help="the peers run holding <model>/inc-mse_v2-dynamic")
    parser.add_argument("--models", default=",".join(WEIGHT_TYPES))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        os.environ.setdefault("QUANTUNE_CACHE_DIR", str(Path(scratch) / "cache"))  # a private, cold cache
        for name in args.models.split(","):
            nc = args.peers / name / "inc-mse_v2-dynamic" / "model.onnx"
            original, ours, parts = build(name, Path(scratch))
            fp32, nc_metric, our_metric = metric(parts, original), metric(parts, nc), metric(parts, ours)
            row = {
                "model": name,
                "weight_type": WEIGHT_TYPES[name],
                "fp32": fp32,
                "nc": nc_metric,
                "quantune": our_metric,
                "nc_loss_pct": 100 * (fp32 - nc_metric) / fp32,
                "quantune_loss_pct": 100 * (fp32 - our_metric) / fp32,
                "nc_mb": nc.stat().st_size / 2**20,
                "quantune_mb": ours.stat().st_size / 2**20,
                **compare(ours, nc),
            }
            rows.append(row)
            print(json.dumps(row, indent=1), flush=True)
    print("\n| model | fp32 | NC (loss) | quantune (loss) | NC weights identical | MB NC / quantune |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['model']} | {r['fp32']:.4f} | {r['nc']:.4f} ({r['nc_loss_pct']:.2f}%) | "
            f"{r['quantune']:.4f} ({r['quantune_loss_pct']:.2f}%) | {r['identical']}/{r['nc_quantized_weights']} | "
            f"{r['nc_mb']:.1f} / {r['quantune_mb']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
