"""MiniLM-L3 with and without the transformer passes, timed side by side in one run.

    python bench/passes_minilm.py [--max-trials 20] [--timeout 240] [--skip-search]

Needs the zoo's MiniLM-L3 (``python bench/zoo/run.py --build-only --models minilm_l3``). Runs
three quantune searches on it, each with a cold cache of its own:

* ``before``: the zoo's zero-knowledge config (static_quant and dynamic_quant flows);
* ``after``: the same plus ``transformer_opt`` and ``weight_only`` (``flows: auto``);
* ``weight4``: ``weight_only`` at 4 bits alone, objective size, the same 1% budget;

then times fp32, fp32 fused (``transformer_opt`` at its defaults), fp16 (``fp16`` at its
defaults, of fp32 and of the fused model), the two bests and the 4-bit model interleaved (one timing run, 1 thread, the first evaluation document), scores
each with the zoo's metric and writes ``bench/results/passes-minilm-<date>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import yaml

import quantune
from quantune.evaluate.latency import LatencySpec, time_side_by_side
from quantune.evaluate.paired import paired_ratio
from quantune.passes import PassContext

ZOO = Path.home() / ".cache" / "quantune-zoo"
MODEL_DIR = ZOO / "minilm_l3"
RUNS = ZOO / "runs" / "passes"
RESULTS = Path(__file__).resolve().parent / "results"

BASE = {
    "model": "model.onnx",
    "data": {"calibration": "data.py:calibration", "evaluation": "data.py:evaluation", "batch_size": 1},
    "evaluation": {"metric": "metric.py:pearson"},
    "criterion": {"type": "relative", "tolerable_loss": 0.01},
    "objective": "latency",
    "search": {"strategy": "quantune"},
}
CONFIGS = {
    "before": {
        "passes": [{"name": "static_quant", "search": True}, {"name": "dynamic_quant", "search": True}],
        "flows": [["static_quant"], ["dynamic_quant"]],
    },
    "after": {
        "passes": [
            {"name": "transformer_opt", "search": True},
            {"name": "static_quant", "search": True},
            {"name": "dynamic_quant", "search": True},
            {"name": "weight_only", "search": True},
        ],
        "flows": "auto",
    },
    "weight4": {
        "objective": "size",
        "passes": [{"name": "weight_only", "search": True, "params": {"bits": 4}}],
        "search": {"strategy": "joint", "sampler": "tpe", "seed": 0},
    },
}


def run_search(name: str, max_trials: int, timeout: float) -> dict:
    config = {**BASE, **CONFIGS[name]}
    # the 4-bit search is small (36 points, no calibration): a shorter limit does
    config["stop"] = {"max_trials": max_trials, "timeout_s": timeout if name != "weight4" else min(timeout, 300)}
    config["cache_dir"] = str(RUNS / f"{name}.cache")
    shutil.rmtree(RUNS / f"{name}.cache", ignore_errors=True)
    path = MODEL_DIR / f"passes-{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    out = RUNS / name
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    result = quantune.tune(path, out)
    best = result.best
    return {
        "config": str(path),
        "wall_s": round(time.perf_counter() - started, 1),
        "trials": len(result.trials),
        "verdict": result.verdict,
        "stop_reason": result.stop_reason,
        "failed": result.failure_classes,
        "model": str(result.best_model_path) if result.best_model_path else None,
        "flow": list(best.flow) if best is not None and hasattr(best, "flow") else None,
        "params": dict(best.params) if best is not None and hasattr(best, "params") else None,
    }


def apply(name: str, model: Path, out: Path) -> Path:
    """One pass at its defaults (transformer_opt, fp16), outside any search."""
    cls = quantune.get_pass(name)
    context = PassContext(None, ["input_ids", "attention_mask"], 1, out.parent)
    cls().run(cls.Config(), model, out, context)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-trials", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--skip-search", action="store_true", help="reuse the searches' last results")
    args = parser.parse_args()
    if not (MODEL_DIR / "model.onnx").is_file():
        print("build MiniLM-L3 first: python bench/zoo/run.py --build-only --models minilm_l3", file=sys.stderr)
        return 2
    RUNS.mkdir(parents=True, exist_ok=True)
    searches_file = RUNS / "searches.json"
    if args.skip_search:
        searches = json.loads(searches_file.read_text())
    else:
        searches = {name: run_search(name, args.max_trials, args.timeout) for name in CONFIGS}
        searches_file.write_text(json.dumps(searches, indent=1, default=str))
    fused = apply("transformer_opt", MODEL_DIR / "model.onnx", RUNS / "fused.onnx")
    models = {
        "fp32": MODEL_DIR / "model.onnx",
        "fp32 fused": fused,
        "fp16": apply("fp16", MODEL_DIR / "model.onnx", RUNS / "fp16.onnx"),
        "fp16 fused": apply("fp16", fused, RUNS / "fused-fp16.onnx"),
    }
    labels = {
        "before": "quantune best, before",
        "after": "quantune best, with new passes",
        "weight4": "weight-only 4-bit",
    }
    for name, label in labels.items():
        if searches[name]["model"]:
            models[label] = Path(searches[name]["model"])
    sys.path[:0] = [str(MODEL_DIR), str(Path(__file__).resolve().parent / "zoo")]
    import metric  # the zoo's Pearson r, imported beside its ratings.npy
    from zoolib import load_feeds

    feeds = load_feeds(MODEL_DIR / "eval_feeds.npz")
    scores = {label: _score(path, feeds, metric.pearson) for label, path in models.items()}
    spec = LatencySpec(warmup=5, repeats=60, threads=1)
    timings = time_side_by_side(list(models.values()), feeds[0], spec)
    rows = []
    for index, (label, path) in enumerate(models.items()):
        ratio = paired_ratio(timings[index], timings[0])
        rows.append(
            {
                "model": label,
                "pearson_r": round(scores[label], 4),
                "loss_vs_fp32_pct": round(100 * (1 - scores[label] / scores["fp32"]), 2),
                "latency_ms": round(float(np.median(timings[index])) * 1000, 3),
                "latency_ratio": round(ratio.median, 3),
                "ratio_interval": [round(ratio.low, 3), round(ratio.high, 3)],
                "size_mb": round(_size(path) / 1e6, 2),
                "size_ratio": round(_size(path) / _size(models["fp32"]), 3),
            }
        )
    stamp = time.strftime("%Y-%m-%d-%H%M", time.gmtime())
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"passes-minilm-{stamp}.json").write_text(
        json.dumps({"rows": rows, "searches": searches, "spec": vars(spec)}, indent=1, default=str)
    )
    lines = [
        f"# MiniLM-L3: the transformer passes, side by side ({stamp} UTC)",
        "",
        f"`python bench/passes_minilm.py --max-trials {args.max_trials} --timeout {args.timeout:g}`; one interleaved "
        f"timing run ({spec.repeats} rounds, 1 thread, the first Lee document), ratio = median of per-round ratios "
        "to fp32 with its 95% interval; Pearson r on the 50 Lee documents; budget 1% relative. Timed on a 2-core "
        "machine shared with other jobs (under load): ratios, not absolute times, are the figures to read.",
        "",
        "| model | r | loss vs fp32 | latency ratio (95% CI) | size MB (vs fp32) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        low, high = row["ratio_interval"]
        lines.append(
            f"| {row['model']} | {row['pearson_r']} | {row['loss_vs_fp32_pct']}% | {row['latency_ratio']}x "
            f"({low}-{high}) | {row['size_mb']} ({row['size_ratio']}x) |"
        )
    lines += ["", "Searches (cold cache each):", ""]
    for name, search in searches.items():
        lines.append(
            f"- `{name}`: {search['trials']} trials, {search['wall_s']} s, verdict {search['verdict']}, "
            f"best flow {search['flow']}, params {_short(search['params'])}"
        )
    (RESULTS / f"passes-minilm-{stamp}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _score(path: Path, feeds: list[dict], metric) -> float:
    from quantune.evaluate.session import open_session

    session = open_session(path, threads=1)
    name = "461"
    return float(metric({name: [session.run([name], feed)[0] for feed in feeds]}, {}))


def _short(params: dict | None) -> dict | None:
    """Node lists shown by their length (a fallback can name a hundred nodes)."""
    if params is None:
        return None
    return {k: f"<{len(v)} nodes>" if isinstance(v, list) else v for k, v in params.items() if k != "flow"}


def _size(path: Path) -> int:
    return sum(file.stat().st_size for file in [path, *path.parent.glob(f"{path.name}.data")])


if __name__ == "__main__":
    sys.exit(main())
