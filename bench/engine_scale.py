"""Engine benchmarks for the issue "The engine at scale" (run: python bench/engine_scale.py).

1. Throughput of sleep-bound synthetic trials (each trial's pass sleeps; evaluation is tiny)
   for 1, 2 and 4 local worker processes and for Ray with 2 workers, as speed-up ratios
   against one worker measured in the same run. Worker start-up is included; Ray's own
   start-up is not (Ray is started before the clock, as a cluster would be).
2. Calibration reuse on the bundled digits example: the time of a static quantization that
   computes its calibration against one that reuses the ranges of an earlier trial with the
   same model, data and calibration settings.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import quantune
from quantune.data import load_dataset
from quantune.model import ModelHandle
from quantune.passes import PassContext, get_pass

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "examples" / "digits"

SLEEP_PLUGIN = '''
from __future__ import annotations
import shutil, time
from quantune import Pass, PassConfig, register_pass

class SleepConfig(PassConfig):
    seconds: float = 0.5
    tag: int = 0

@register_pass
class Sleep(Pass):
    """Copies the model after sleeping: a trial whose cost is waiting, not computing."""
    name = "sleep"
    Config = SleepConfig
    def run(self, config, model_in, model_out, context):
        time.sleep(config.seconds)
        shutil.copyfile(model_in, model_out)
'''


def _sleep_config(folder: Path, trials: int, seconds: float, executor: dict) -> dict:
    plugin = folder / "sleep_plugin.py"
    plugin.write_text(SLEEP_PLUGIN)
    return {
        "model": str(DIGITS / "model.onnx"),
        "data": {"evaluation": str(DIGITS / "eval.npz"), "batch_size": 64},
        "evaluation": {"latency": {"warmup": 1, "repeats": 5}},
        "plugins": [str(plugin)],
        "passes": [
            {"name": "sleep", "params": {"seconds": seconds, "tag": {"search": list(range(trials))}}},
        ],
        "search": {"sampler": "exhaustive"},
        "stop": {"max_trials": trials},
        "cache_dir": str(folder / "cache"),
        "executor": executor,
    }


def throughput(trials: int, seconds: float, with_ray: bool) -> list[tuple[str, int, float]]:
    rows = []
    setups = [("process", 1), ("process", 2), ("process", 4)] + ([("ray", 2)] if with_ray else [])
    for kind, workers in setups:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            config = _sleep_config(folder, trials, seconds, {"kind": kind, "workers": workers})
            quantune.tune({**config, "stop": {"max_trials": 1}}, output=folder / "warm")  # baseline into the cache
            started = time.perf_counter()
            result = quantune.tune(config, output=folder / "out", restart=True)
            elapsed = time.perf_counter() - started
            assert all(t.status == "ok" for t in result.trials), [t.error for t in result.trials]
            rows.append((f"{kind} x{workers}", workers, elapsed))
    return rows


def calibration_reuse(repeats: int) -> list[tuple[str, float, float]]:
    model = ModelHandle.from_path(DIGITS / "model.onnx")
    calibration = load_dataset("calib.npz", field_name="calibration", base_dir=DIGITS)
    static = get_pass("static_quant")
    rows = []
    for method in ("MinMax", "Entropy", "Percentile"):
        cold, warm = [], []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp)
                context = PassContext(
                    calibration, model.input_names(), 64, folder, model_sha256=model.sha256, cache_dir=folder / "calib"
                )
                first = static.Config(calibrate_method=method, activation_type="uint8")
                second = static.Config(calibrate_method=method, activation_type="int8", per_channel=True)
                started = time.perf_counter()
                static().run(first, model.path, folder / "a.onnx", context)
                cold.append(time.perf_counter() - started)
                started = time.perf_counter()
                static().run(second, model.path, folder / "b.onnx", context)  # same calibration settings: reused
                warm.append(time.perf_counter() - started)
        rows.append((method, float(np.median(cold)), float(np.median(warm))))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=1.0, help="sleep per trial")
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with_ray = not args.no_ray
    if with_ray:
        try:
            import ray
        except ImportError:
            with_ray = False
        else:
            ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)

    rows = throughput(args.trials, args.seconds, with_ray)
    base = rows[0][2]
    print(f"\n## Throughput: {args.trials} sleep-bound trials of {args.seconds:g} s each\n")
    print("| executor | workers | wall s | trials/s | speed-up vs 1 worker | speed-up / workers |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, workers, elapsed in rows:
        speedup = base / elapsed
        print(
            f"| {name} | {workers} | {elapsed:.2f} | {args.trials / elapsed:.2f} | {speedup:.2f} | {speedup / workers:.2f} |"
        )

    print("\n## Calibration reuse: one static quantization of the digits CNN (median of", args.repeats, "runs)\n")
    print("| calibrate_method | computes calibration (s) | reuses calibration (s) | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for method, cold, warm in calibration_reuse(args.repeats):
        print(f"| {method} | {cold:.3f} | {warm:.3f} | {cold / warm:.2f}x |")


if __name__ == "__main__":
    main()
