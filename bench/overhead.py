"""Search overhead: what asking and telling cost, alone and with the engine, when a trial
itself costs nothing.

    python bench/overhead.py [--seed 0] [--fast N] [--optuna N] [--engine-fast N] [--engine-optuna N]

Builds a space of more than 10^12 points (12 ten-way categoricals, a conditional on one of
them, an integer range and a stepped float range, and a rule that prunes a few points), then
times ``N`` ask+tell rounds per sampler with a trivial objective, so the table shows the
search machinery alone: what quantune adds on top of each real trial (each sampler gets a
3-trial warm-up first, so one-time imports such as scipy's are not counted). It also times
``raw_size()`` on that space and on a far larger one (10^400+ points, 300 conditionals).

The second table runs the whole engine (``quantune.tune``, in-process executor) over a
10^12-point space of a no-op pass (it copies a tiny model): per trial it pays for the
sampler, plan validation, the pass cache (hash, atomic rename), the evaluation cache hit, the
SQLite record and the log line — everything quantune adds around a real pass.

A benchmark, not a test: it prints markdown tables and asserts nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import optuna
from onnx import TensorProto, helper

import quantune
from quantune.search import Feedback, create_sampler
from quantune.space import Categorical, Conditional, FloatRange, IntRange, SearchSpace

N_PARAMS = 12  # p0 ... p11, in the sampler-only space and in the engine's no-op pass alike


def big_space() -> SearchSpace:
    params: dict[str, Any] = {f"p{i}": Categorical(tuple(range(10))) for i in range(N_PARAMS)}
    params["percentile"] = Conditional.on("p0", {value: (99.9, 99.99, 99.999) for value in range(5)})
    params["samples"] = IntRange(16, 1024, step=16)
    params["alpha"] = FloatRange(0.0, 1.0, step=0.05)
    return SearchSpace(params, [lambda p: not (p["p1"] == 9 and p["p2"] == 9)])


def huge_space() -> SearchSpace:
    params: dict[str, Any] = {}
    for i in range(300):
        params[f"a{i}"] = Categorical(tuple(range(10)))
        params[f"b{i}"] = Conditional.on(f"a{i}", {v: tuple(range(v + 1)) for v in range(10)})
    return SearchSpace(params)


def objective(point: Mapping[str, Any]) -> Feedback:
    value = sum(v for k, v in point.items() if k.startswith("p")) + point["samples"] / 1024 + point["alpha"]
    return Feedback(float(value), violation=0.0 if value < 60 else 0.1)


def run(name: str, space: SearchSpace, trials: int, seed: int, **options: Any) -> tuple[int, float]:
    sampler = create_sampler(name, seed=seed, **options)
    started = time.perf_counter()
    sampler.bind(space)
    done = 0
    while done < trials and (point := sampler.ask()) is not None:
        sampler.tell(point, objective(point))
        done += 1
    return done, time.perf_counter() - started


NOOP_PLUGIN = """
from __future__ import annotations
import shutil
from quantune import Pass, PassConfig, register_pass

class NoopConfig(PassConfig):
{FIELDS}

@register_pass
class Noop(Pass):
    name = "noop"
    Config = NoopConfig
    def run(self, config, model_in, model_out, context):
        shutil.copyfile(model_in, model_out)
""".replace("{FIELDS}", "\n".join(f"    p{i}: int = 0" for i in range(N_PARAMS)))


def engine_config(folder: Path, sampler: str, trials: int, seed: int) -> dict[str, Any]:
    """A 10^12-point space (12 parameters x 10 values) over a pass that does nothing."""
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "tiny.onnx")
    np.savez(folder / "data.npz", x=np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32))
    (folder / "noop.py").write_text(NOOP_PLUGIN)
    return {
        "model": str(folder / "tiny.onnx"),
        "data": {"evaluation": str(folder / "data.npz"), "batch_size": 4},
        "evaluation": {"metric": "cosine", "latency": {"warmup": 0, "repeats": 1}},
        "plugins": [str(folder / "noop.py")],
        "passes": [{"name": "noop", "params": {f"p{i}": {"search": {"int": [0, 9]}} for i in range(N_PARAMS)}}],
        "search": {"sampler": sampler, "seed": seed},
        "stop": {"max_trials": trials},
        "cache_dir": str(folder / "cache"),
        "executor": {"kind": "inline"},
    }


def run_engine(sampler: str, trials: int, seed: int) -> tuple[int, float]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = engine_config(folder, sampler, trials, seed)
        quantune.tune({**config, "stop": {"max_trials": 1}}, output=folder / "warm")  # imports, baseline
        started = time.perf_counter()
        result = quantune.tune(config, output=folder / "out")
        return len(result.trials), time.perf_counter() - started


def timed(call: Any, repeats: int = 5) -> tuple[Any, float]:
    best = float("inf")
    result = None
    for _ in range(repeats):
        started = time.perf_counter()
        result = call()
        best = min(best, time.perf_counter() - started)
    return result, best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fast", type=int, default=200, help="trials for exhaustive and random")
    parser.add_argument("--optuna", type=int, default=100, help="trials for the Optuna samplers")
    parser.add_argument("--engine-fast", type=int, default=200, help="engine trials for exhaustive and random")
    parser.add_argument("--engine-optuna", type=int, default=50, help="engine trials for the Optuna samplers")
    args = parser.parse_args()

    space = big_space()
    size, size_s = timed(space.raw_size)
    huge = huge_space()
    huge_size, huge_s = timed(huge.raw_size)
    print(f"python {platform.python_version()}, optuna {optuna.__version__}, {platform.machine()}")
    print()
    print("| space | parameters | raw_size() | time |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| bench space | {len(space)} | {size:,} ({size:.2e}) | {size_s * 1e3:.3f} ms |")
    digits = f"{len(str(huge_size))} digits, = 55^300: {huge_size == 55**300}"
    print(
        f"| 300 independent conditionals | {len(huge)} | {str(huge_size)[:6]}... ({digits}) | {huge_s * 1e3:.3f} ms |"
    )
    print()

    plan: list[tuple[str, int, dict[str, Any], str]] = [
        ("exhaustive", args.fast, {}, ""),
        ("random", args.fast, {}, ""),
        ("tpe", args.optuna, {}, ""),
        ("cmaes", args.optuna, {}, "" if importlib.util.find_spec("cmaes") else "the 'cmaes' package is not installed"),
        ("qmc", args.optuna, {}, ""),
        ("nsga2", args.optuna, {}, ""),
        ("gp", min(args.optuna, 50), {}, "" if importlib.util.find_spec("torch") else "torch is not installed"),
    ]
    print("| sampler | trials | total s | ms per trial |")
    print("| --- | ---: | ---: | ---: |")
    for name, trials, options, skipped in plan:
        if skipped:
            print(f"| {name} | skipped: {skipped} | | |")
            continue
        run(name, space, 3, args.seed, **options)  # warm-up: first-use imports (scipy, cmaes) are not overhead
        done, seconds = run(name, space, trials, args.seed, **options)
        print(f"| {name} | {done} | {seconds:.3f} | {seconds / max(done, 1) * 1e3:.2f} |")
        sys.stdout.flush()

    print()
    print("Engine + sampler, no-op pass, 10^12-point space, in-process executor:")
    print()
    print("| sampler | trials | total s | ms per trial |")
    print("| --- | ---: | ---: | ---: |")
    for name, _, _, skipped in plan:
        if skipped:
            print(f"| {name} | skipped: {skipped} | | |")
            continue
        engine_trials = args.engine_fast if name in ("exhaustive", "random") else args.engine_optuna
        done, seconds = run_engine(name, engine_trials, args.seed)
        print(f"| {name} | {done} | {seconds:.3f} | {seconds / max(done, 1) * 1e3:.2f} |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
