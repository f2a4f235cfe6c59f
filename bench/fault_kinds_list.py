"""The kinds of bad input and fault that bench/fault_kinds.py tries, one setup function each.

A setup breaks one thing in a fresh copy of the digits example (``p``: a ``Project``) and
returns the CLI arguments to run (``None``: cannot be set up here, e.g. no tmpfs mount).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RUN = ["run", "config.yaml", "-q", "-o", "out"]


@dataclass(frozen=True)
class Kind:
    group: str
    name: str
    setup: Callable[[Any], list[str] | None]
    codes: tuple[int, ...] = (2,)
    names: tuple[str, ...] = ()  # the error line (or, for exit 0, the output) names one of these
    after: Callable[[Any, Any], str | None] | None = None  # a further check of the outcome
    own_out: bool = False  # the folder 'out' is a run's own (a resume): its files may change
    changing: tuple[str, ...] = ()  # user files the fault itself changes during the run


def cfg(*changes: tuple[str, Any], args: list[str] | None = None) -> Callable[[Any], list[str]]:
    """A setup that sets config fields (dotted path, value) and runs."""

    def setup(p: Any) -> list[str]:
        for dotted, value in changes:
            p.set(dotted, value)
        p.save_config()
        return list(args or RUN)

    return setup


def text_config(text: str | bytes, name: str = "config.yaml") -> Callable[[Any], list[str]]:
    def setup(p: Any) -> list[str]:
        p.write(name, text)
        return ["run", name, "-q", "-o", "out"]

    return setup


def script(site: str, name: str, code: str, function: str) -> Callable[[Any], list[str]]:
    """A setup that points ``site`` (a dotted field) at ``name:function`` holding ``code``."""

    def setup(p: Any) -> list[str]:
        p.write(name, "import os, sys\nimport numpy as np\n\n" + code)
        p.set(site, f"{name}:{function}")
        p.save_config()
        return RUN

    return setup


def data(name: str, make: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], site: str = "data.evaluation"):
    def setup(p: Any) -> list[str]:
        p.set(site, p.npz(name, **make(p.eval_arrays())))
        p.save_config()
        return RUN

    return setup


def model(make: Callable[[Any], None], name: str = "bad.onnx") -> Callable[[Any], list[str]]:
    def setup(p: Any) -> list[str]:
        make(p.folder / name)
        p.set("model", name)
        p.save_config()
        return RUN

    return setup


def _no_input_model(path: Any) -> None:
    value = numpy_helper.from_array(np.ones((1, 10), np.float32))
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["y"], value=value)],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _quantized(form: str) -> Callable[[Any], None]:
    """The digits model quantized by onnxruntime (QDQ: static; QOperator: dynamic), saved at ``path``."""

    def make(path: Any) -> None:
        from onnxruntime.quantization import QuantFormat, quantize_dynamic, quantize_static

        source = str(path.parent / "model.onnx")
        if form == "QOperator":
            quantize_dynamic(source, str(path))
            return
        with np.load(path.parent / "calib.npz") as calib:
            rows = iter([{"input": calib["input"][i : i + 1]} for i in range(8)])
        reader = type("Rows", (), {"get_next": lambda self: next(rows, None)})()
        quantize_static(source, str(path), reader, quant_format=QuantFormat.QDQ)

    return make


def _external_data_gone(path: Any) -> None:
    onnx.save(
        onnx.load(str(path.parent / "model.onnx")),
        str(path),
        save_as_external_data=True,
        location="bad.onnx.data",
        size_threshold=0,
    )
    (path.parent / "bad.onnx.data").unlink()


def _replaced_during_the_run(p: Any) -> list[str]:
    """A metric that copies other weights over model.onnx on its second call (the first trial's
    evaluation; the first scores the original), as a user copying a model in while trials run."""
    proto = onnx.load(str(p.folder / "model.onnx"))
    for init in proto.graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * -3.0, init.name))
    onnx.save(proto, str(p.folder / "other.onnx"))
    swap = (
        "    calls = os.path.join(os.path.dirname(__file__), 'calls.txt')\n"
        "    count = len(open(calls).read()) + 1 if os.path.exists(calls) else 1\n"
        "    open(calls, 'w').write('x' * count)\n"
        "    if count == 2:\n"
        "        import shutil\n"
        "        shutil.copyfile(os.path.join(os.path.dirname(__file__), 'other.onnx'), "
        "os.path.join(os.path.dirname(__file__), 'model.onnx'))\n"
        "    return good\n"
    )
    return script("evaluation.metric", "m.py", METRIC + swap, "score")(p)


def _cache_inside_output(restart: bool) -> Callable[[Any], list[str]]:
    """``cache_dir: out/cache`` with ``-o out``: a run, or a run and then the same with --restart."""

    def setup(p: Any) -> list[str]:
        p.set("cache_dir", "out/cache")
        p.save_config()
        return twice(lambda p: None, [*RUN, "--restart"])(p) if restart else RUN

    return setup


def _truncated(path: Any) -> None:
    path.write_bytes((path.parent / "model.onnx").read_bytes()[:5000])


def env_setup(env: dict[str, str], drop_cache: bool = True) -> Callable[[Any], list[str]]:
    def setup(p: Any) -> list[str]:
        if drop_cache:
            p.config.pop("cache_dir", None)
        p.env.update(env)
        p.save_config()
        return RUN

    return setup


def blocked(args: list[str], make: Callable[[Any], None]) -> Callable[[Any], list[str]]:
    def setup(p: Any) -> list[str]:
        make(p)
        p.save_config()
        return args

    return setup


def mounted(size: str, where: str, read_only: bool = False) -> Callable[[Any], list[str] | None]:
    """A run whose output (``where='out'``) or cache (``'cache'``) is on a small or read-only tmpfs."""

    def setup(p: Any) -> list[str] | None:
        point = p.mount("disk", size, read_only)
        if point is None:
            return None
        if where == "cache":
            p.set("cache_dir", str(point / "cache"))
            p.set("stop.max_trials", 6)
            p.save_config()
            return RUN
        p.save_config()
        return ["run", "config.yaml", "-q", "-o", str(point / "out")]

    return setup


def twice(between: Callable[[Any], None], second: list[str] | None = None) -> Callable[[Any], list[str]]:
    """A first run, ``between`` done to its folder, then the command to judge (a resume by default)."""

    def setup(p: Any) -> list[str]:
        p.save_config()
        first = p.quantune(*RUN)
        if first.returncode != 0:
            raise RuntimeError(f"the first run failed: {first.stderr[-500:]}")
        between(p)
        return list(second or RUN)

    return setup


def _rm(*names: str) -> Callable[[Any], None]:
    def remove(p: Any) -> None:
        for name in names:
            path = p.folder / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)

    return remove


def _same_best(p: Any, done: Any) -> str | None:
    results = json.loads((p.folder / "out" / "results.json").read_text())
    best = results.get("best") or {}
    params = p.folder / "out" / "best" / "params.json"
    if results.get("verdict") == "improved" and not (p.folder / "out" / "best" / "model.onnx").is_file():
        return "best/model.onnx missing"
    if (
        params.is_file()
        and best
        and json.loads(params.read_text()).get("number", best.get("number")) != best.get("number")
    ):
        return "best/params.json is another trial than results.json's best"
    return None


def _other_seed(p: Any) -> None:
    p.set("search.seed", 1)
    p.save_config()


LOAD = "def load():\n    data = dict(np.load('eval.npz'))\n"
METRIC = (
    "def score(outputs, data):\n    logits = next(iter(outputs.values()))\n"
    "    good = float(np.mean(np.argmax(logits, axis=1) == data['label']))\n"
)
RUNNER = (
    "def run(session, feeds):\n"
    "    good = [dict(zip([o.name for o in session.get_outputs()], session.run(None, dict(f)))) for f in feeds]\n"
)
TRIAL = (
    "    if 'QuantizeLinear' in str([n.op_type for n in __import__('onnx').load(session._model_path).graph.node]):\n"
)

KINDS: list[Kind] = [
    # -- the config file ------------------------------------------------------------------------
    Kind("config", "no config file", lambda p: ["run", "missing.yaml", "-q"], names=("missing.yaml",)),
    Kind(
        "config", "config is a folder", lambda p: (p.folder / "c.yaml").mkdir() or ["run", "c.yaml"], names=("c.yaml",)
    ),
    Kind("config", "empty config file", text_config(""), names=("config.yaml",)),
    Kind("config", "binary config", text_config(b"model: m\n\xf0\x28\x8c\x28\x00"), names=("config.yaml",)),
    Kind("config", "YAML syntax error", text_config("model: [unclosed\n"), names=("config.yaml",)),
    Kind("config", "JSON syntax error", text_config('{"model": ', "c.json"), names=("c.json",)),
    Kind("config", "top level is a list", text_config("- model.onnx\n"), names=("top level",)),
    Kind("config", "duplicate key", text_config("model: model.onnx\nmodel: other.onnx\n"), names=("'model'",)),
    Kind("config", "duplicate JSON key", text_config('{"model": "a", "model": "b"}', "c.json"), names=("'model'",)),
    Kind("config", "unknown top-level field", cfg(("modle", "x")), names=("modle",)),
    Kind("config", "unknown nested field", cfg(("stop.max_trial", 3)), names=("stop.max_trial",)),
    Kind(
        "config",
        "model missing from config",
        lambda p: p.config.pop("model") and p.save_config() and RUN,
        names=("model",),
    ),
    Kind(
        "config",
        "data missing from config",
        lambda p: p.config.pop("data") and p.save_config() and RUN,
        names=("data",),
    ),
    Kind("config", "passes: []", cfg(("passes", [])), names=("passes",)),
    Kind("config", "unknown pass", cfg(("passes", [{"name": "static_quantize"}])), names=("static_quantize",)),
    Kind(
        "config",
        "unknown pass parameter",
        cfg(("passes", [{"name": "static_quant", "params": {"formt": "QDQ"}}])),
        names=("formt",),
    ),
    Kind(
        "config",
        "bad pass value",
        cfg(("passes", [{"name": "static_quant", "params": {"quant_format": "QXX"}}])),
        names=("quant_format",),
    ),
    Kind("config", "max_trials: 0", cfg(("stop.max_trials", 0)), names=("stop.max_trials",)),
    Kind("config", "max_trials: -1", cfg(("stop.max_trials", -1)), names=("stop.max_trials",)),
    Kind("config", "max_trials: true", cfg(("stop.max_trials", True)), names=("stop.max_trials",)),
    Kind("config", "max_trials: five", cfg(("stop.max_trials", "five")), names=("stop.max_trials",)),
    Kind("config", "max_trials: 2.5", cfg(("stop.max_trials", 2.5)), names=("stop.max_trials",)),
    Kind("config", "batch_size: 0", cfg(("data.batch_size", 0)), names=("data.batch_size",)),
    Kind("config", "batch_size: true", cfg(("data.batch_size", True)), names=("data.batch_size",)),
    Kind("config", "tolerable_loss: -1", cfg(("criterion.tolerable_loss", -1)), names=("criterion.tolerable_loss",)),
    Kind(
        "config", "tolerable_loss: .nan", cfg(("criterion.tolerable_loss", float("nan"))), (0, 2), ("tolerable_loss",)
    ),
    Kind("config", "tolerable_loss: .inf", cfg(("criterion.tolerable_loss", float("inf"))), (0,), ("not guarded",)),
    Kind("config", "tolerable_loss: 50 (relative)", cfg(("criterion.tolerable_loss", 50)), (0,), ("did you mean 0.5",)),
    Kind("config", "criterion.type: bogus", cfg(("criterion.type", "bogus")), names=("criterion.type",)),
    Kind("config", "objective: bogus", cfg(("objective", "speed")), names=("objective",)),
    Kind("config", "search.sampler: bogus", cfg(("search.sampler", "bayes")), names=("search.sampler",)),
    Kind("config", "search.seed: -1", cfg(("search.seed", -1)), names=("search.seed",)),
    Kind("config", "search.strategy: bogus", cfg(("search.strategy", "greedy")), names=("search.strategy",)),
    Kind("config", "executor.kind: bogus", cfg(("executor.kind", "threads")), names=("executor.kind",)),
    Kind("config", "executor.workers: 0", cfg(("executor.workers", 0)), names=("executor.workers",)),
    Kind("config", "memory_limit_mb: 1", cfg(("executor.memory_limit_mb", 1)), names=("executor.memory_limit_mb",)),
    Kind("config", "memory_limit_mb: 100", cfg(("executor.memory_limit_mb", 100)), names=("executor.memory_limit_mb",)),
    Kind("config", "latency.repeats: 0", cfg(("evaluation.latency.repeats", 0)), names=("evaluation.latency.repeats",)),
    Kind(
        "config",
        "latency.warmup: 10^9",
        cfg(("evaluation.latency.warmup", 10**9)),
        names=("evaluation.latency.warmup",),
    ),
    Kind("config", "unknown built-in metric", cfg(("evaluation.metric", "top5")), names=("evaluation.metric",)),
    Kind("config", "flows name an unknown step", cfg(("flows", [["nope"]])), names=("flows", "nope")),
    Kind(
        "config", "plugin file missing", cfg(("plugins", ["missing_plugin.py"])), names=("missing_plugin.py", "plugins")
    ),
    Kind(
        "config",
        "--set on an unknown path",
        lambda p: p.save_config() and [*RUN, "--set", "stop.max_trail=3"],
        names=("stop.max_trail",),
    ),
    Kind(
        "config",
        "--set without '='",
        lambda p: p.save_config() and [*RUN, "--set", "stop.max_trials"],
        names=("--set",),
    ),
    Kind(
        "config",
        "--set unparsable YAML",
        lambda p: p.save_config() and [*RUN, "--set", "stop.max_trials=[1"],
        names=("--set",),
    ),
    # -- the model ------------------------------------------------------------------------------
    Kind("model", "model file missing", cfg(("model", "nope.onnx")), names=("nope.onnx",)),
    Kind("model", "model is an empty file", model(lambda path: path.write_bytes(b"")), names=("bad.onnx",)),
    Kind("model", "model is a text file", model(lambda path: path.write_text("hello")), names=("bad.onnx",)),
    Kind("model", "model truncated", model(_truncated), names=("bad.onnx",)),
    Kind("model", "model with no inputs", model(_no_input_model), names=("bad.onnx",)),
    Kind("model", "model is a folder", model(lambda path: path.mkdir()), names=("bad.onnx",)),
    Kind("model", "model quantized already (QDQ)", model(_quantized("QDQ")), names=("quantized already",)),
    Kind("model", "model quantized already (QOperator)", model(_quantized("QOperator")), names=("quantized already",)),
    Kind(
        "model",
        "model's external data file missing",
        model(_external_data_gone),
        names=("external data file(s) bad.onnx.data",),
    ),
    Kind(
        "model",
        "model replaced during the run",
        _replaced_during_the_run,
        names=("model.onnx",),
        changing=("model.onnx", "calls.txt"),
    ),
    # -- the data -------------------------------------------------------------------------------
    Kind("data", "data file missing", cfg(("data.evaluation", "nope.npz")), names=("nope.npz",)),
    Kind(
        "data",
        "data is a text file",
        lambda p: p.write("t.npz", "hi") and cfg(("data.evaluation", "t.npz"))(p),
        names=("t.npz",),
    ),
    Kind("data", "npz with no arrays", data("e.npz", lambda d: {}), names=("e.npz", "data.evaluation")),
    Kind(
        "data",
        "wrong input name",
        data("e.npz", lambda d: {"pixels": d["input"], "label": d["label"]}),
        names=("e.npz",),
    ),
    Kind(
        "data",
        "wrong rank",
        data("e.npz", lambda d: {"input": d["input"][:, 0], "label": d["label"]}),
        names=("e.npz",),
    ),
    Kind(
        "data",
        "wrong fixed dimension",
        data("e.npz", lambda d: {"input": d["input"][:, :, :6], "label": d["label"]}),
        names=("e.npz",),
    ),
    Kind(
        "data",
        "int64 for a float32 input",
        data("e.npz", lambda d: {"input": (d["input"] * 16).astype(np.int64), "label": d["label"]}),
        names=("e.npz",),
    ),
    Kind(
        "data",
        "uint8 for a float32 input",
        data("e.npz", lambda d: {"input": (d["input"] * 255).astype(np.uint8), "label": d["label"]}),
        names=("e.npz",),
    ),
    Kind(
        "data",
        "bool for a float32 input",
        data("e.npz", lambda d: {"input": d["input"] > 0.5, "label": d["label"]}),
        names=("e.npz",),
    ),
    Kind(
        "data",
        "float64 input (converted)",
        data("e.npz", lambda d: {"input": d["input"].astype(np.float64), "label": d["label"]}),
        (0,),
    ),
    Kind(
        "data",
        "complex input",
        data("e.npz", lambda d: {"input": d["input"].astype(np.complex64), "label": d["label"]}),
        names=("e.npz",),
    ),
    Kind(
        "data",
        "string input",
        data("e.npz", lambda d: {"input": np.full(d["input"].shape, "a"), "label": d["label"]}),
        names=("e.npz",),
    ),
    Kind(
        "data",
        "NaN in the input",
        data(
            "e.npz",
            lambda d: {"input": np.where(d["input"] > 0.9, np.nan, d["input"]).astype(np.float32), "label": d["label"]},
        ),
        names=("e.npz",),
    ),
    Kind(
        "data",
        "Inf in the input",
        data(
            "e.npz",
            lambda d: {"input": np.where(d["input"] > 0.9, np.inf, d["input"]).astype(np.float32), "label": d["label"]},
        ),
        names=("e.npz",),
    ),
    Kind(
        "data",
        "NaN labels",
        data("e.npz", lambda d: {"input": d["input"], "label": np.where(d["label"] == 3, np.nan, d["label"])}),
        names=("e.npz",),
    ),
    Kind(
        "data",
        "string labels",
        data("e.npz", lambda d: {"input": d["input"], "label": d["label"].astype(str)}),
        names=("e.npz",),
    ),
    Kind("data", "no labels for top1", data("e.npz", lambda d: {"input": d["input"]}), names=("e.npz",)),
    Kind(
        "data",
        "zero rows",
        data("e.npz", lambda d: {"input": d["input"][:0], "label": d["label"][:0]}),
        names=("e.npz",),
    ),
    Kind(
        "data",
        "arrays of different lengths",
        data("e.npz", lambda d: {"input": d["input"], "label": d["label"][:10]}),
        names=("e.npz",),
    ),
    Kind(
        "data",
        "calibration: wrong rank",
        data("c.npz", lambda d: {"input": d["input"][:, 0]}, "data.calibration"),
        names=("c.npz",),
    ),
    Kind(
        "data",
        "calibration: zero rows",
        data("c.npz", lambda d: {"input": d["input"][:0]}, "data.calibration"),
        names=("c.npz",),
    ),
    # -- a loader script ------------------------------------------------------------------------
    Kind(
        "loader",
        "loader raises",
        script("data.evaluation", "l.py", LOAD + "    raise RuntimeError('boom')\n", "load"),
        names=("l.py",),
    ),
    Kind(
        "loader",
        "loader returns None",
        script("data.evaluation", "l.py", LOAD + "    return None\n", "load"),
        names=("l.py",),
    ),
    Kind(
        "loader",
        "loader returns an int",
        script("data.evaluation", "l.py", LOAD + "    return 7\n", "load"),
        names=("l.py",),
    ),
    Kind(
        "loader",
        "loader returns a list of ints",
        script("data.evaluation", "l.py", LOAD + "    return [1, 2]\n", "load"),
        names=("l.py",),
    ),
    Kind(
        "loader",
        "loader returns strings",
        script("data.evaluation", "l.py", LOAD + "    return {'input': 'x'}\n", "load"),
        names=("l.py",),
    ),
    Kind(
        "loader",
        "loader returns []",
        script("data.evaluation", "l.py", LOAD + "    return []\n", "load"),
        names=("l.py",),
    ),
    Kind(
        "loader",
        "feeds with different names",
        script("data.evaluation", "l.py", LOAD + "    return [data, {'x': data['input']}]\n", "load"),
        names=("l.py",),
    ),
    Kind(
        "loader",
        "loader function missing",
        script("data.evaluation", "l.py", LOAD + "    return data\n", "lod"),
        names=("l.py", "lod"),
    ),
    Kind("loader", "loader syntax error", script("data.evaluation", "l.py", "def load(:\n", "load"), names=("l.py",)),
    Kind(
        "loader",
        "loader not deterministic",
        lambda p: (
            (p.set("executor.kind", "process") and None)
            or script(
                "data.evaluation",
                "l.py",
                LOAD
                + "    data['input'] = data['input'] + np.random.default_rng().normal(0, .01, data['input'].shape).astype('float32')\n    return data\n",
                "load",
            )(p)
        ),
        names=("deterministic",),
    ),
    Kind(
        "loader",
        "loader calls sys.exit(0)",
        script("data.evaluation", "l.py", LOAD + "    sys.exit(0)\n", "load"),
        names=("l.py",),
    ),
    # -- a metric script ------------------------------------------------------------------------
    Kind(
        "metric",
        "metric raises",
        script("evaluation.metric", "m.py", METRIC + "    raise ValueError('boom')\n", "score"),
        names=("m.py",),
    ),
    Kind(
        "metric",
        "metric returns None",
        script("evaluation.metric", "m.py", METRIC + "    return None\n", "score"),
        names=("m.py", "evaluation.metric"),
    ),
    Kind(
        "metric",
        "metric returns a string",
        script("evaluation.metric", "m.py", METRIC + "    return 'high'\n", "score"),
        names=("m.py", "evaluation.metric"),
    ),
    Kind(
        "metric",
        "metric returns a number as a string ('0.98')",
        script("evaluation.metric", "m.py", METRIC + "    return '0.98'\n", "score"),
        names=("returned str '0.98'",),
    ),
    Kind(
        "metric",
        "metric returns a bool",
        script("evaluation.metric", "m.py", METRIC + "    return good > 0.5\n", "score"),
        names=("returned bool",),
    ),
    Kind(
        "metric",
        "metric returns a tuple",
        script("evaluation.metric", "m.py", METRIC + "    return good, 1\n", "score"),
        names=("returned tuple",),
    ),
    Kind(
        "metric",
        "metric returns a dict",
        script("evaluation.metric", "m.py", METRIC + "    return {'top1': good}\n", "score"),
        names=("returned dict",),
    ),
    Kind(
        "metric",
        "metric returns NaN",
        script("evaluation.metric", "m.py", METRIC + "    return float('nan')\n", "score"),
        names=("m.py", "evaluation.metric"),
    ),
    Kind(
        "metric",
        "metric returns inf",
        script("evaluation.metric", "m.py", METRIC + "    return float('inf')\n", "score"),
        names=("m.py", "evaluation.metric"),
    ),
    Kind(
        "metric",
        "metric returns an array",
        script("evaluation.metric", "m.py", METRIC + "    return np.zeros(3)\n", "score"),
        names=("m.py", "evaluation.metric"),
    ),
    Kind(
        "metric",
        "metric random between calls",
        script("evaluation.metric", "m.py", METRIC + "    return good - np.random.random() * 0.001\n", "score"),
        (0,),
    ),
    Kind(
        "metric",
        "metric NaN on candidates only (TPE)",
        script(
            "evaluation.metric",
            "m.py",
            "CALLS = [0]\n\n" + METRIC + "    CALLS[0] += 1\n    return good if CALLS[0] == 1 else float('nan')\n",
            "score",
        ),
        (0, 2),
        ("m.py", "evaluation.metric"),
    ),
    Kind(
        "metric",
        "metric os._exit(3) (workers)",
        lambda p: (
            (p.set("executor.kind", "process") and None)
            or script("evaluation.metric", "m.py", METRIC + "    os._exit(3)\n", "score")(p)
        ),
        names=("os._exit(3)",),
    ),
    Kind("metric", "metric file missing", cfg(("evaluation.metric", "nope.py:score")), names=("nope.py",)),
    Kind(
        "metric",
        "metric imports a missing module",
        script("evaluation.metric", "m.py", "import not_a_module\n" + METRIC + "    return good\n", "score"),
        names=("m.py",),
    ),
    Kind(
        "metric",
        "metric hangs (executor.trial_timeout_s: 3)",
        lambda p: (
            (p.set("executor", {"kind": "process", "trial_timeout_s": 3}) and None)
            or script("evaluation.metric", "m.py", "import time\n\n" + METRIC + "    time.sleep(3600)\n", "score")(p)
        ),
        names=("3 s",),
    ),
    Kind(
        "runner",
        "runner hangs (executor.trial_timeout_s: 3)",
        lambda p: (
            (p.set("executor", {"kind": "process", "trial_timeout_s": 3}) and None)
            or script("evaluation.runner", "r.py", "import time\n\n" + RUNNER + "    time.sleep(3600)\n", "run")(p)
        ),
        names=("3 s",),
    ),
    # -- a runner script ------------------------------------------------------------------------
    Kind(
        "runner",
        "runner raises",
        script("evaluation.runner", "r.py", RUNNER + "    raise RuntimeError('boom')\n", "run"),
        names=("r.py", "evaluation.runner"),
    ),
    Kind(
        "runner",
        "runner returns None",
        script("evaluation.runner", "r.py", RUNNER + "    return None\n", "run"),
        names=("r.py", "evaluation.runner"),
    ),
    Kind(
        "runner",
        "runner returns a dict",
        script("evaluation.runner", "r.py", RUNNER + "    return good[0]\n", "run"),
        names=("r.py", "evaluation.runner"),
    ),
    Kind(
        "runner",
        "runner returns too few",
        script("evaluation.runner", "r.py", RUNNER + "    return good[:1]\n", "run"),
        names=("r.py", "evaluation.runner"),
    ),
    Kind(
        "runner",
        "runner fails on candidates",
        script(
            "evaluation.runner",
            "r.py",
            RUNNER + TRIAL + "        raise RuntimeError('no int8')\n    return good\n",
            "run",
        ),
        (0,),
    ),
    # -- the environment ------------------------------------------------------------------------
    Kind(
        "environment",
        "--output is a file",
        blocked(["run", "config.yaml", "-q", "-o", "f"], lambda p: p.write("f", "mine")),
        names=("f",),
    ),
    Kind(
        "environment",
        "--output under a file",
        blocked(["run", "config.yaml", "-q", "-o", "f/out"], lambda p: p.write("f", "mine")),
        names=("f",),
    ),
    Kind(
        "environment",
        "--output /proc/nope/out",
        blocked(["run", "config.yaml", "-q", "-o", "/proc/nope/out"], lambda p: None),
        names=("/proc/nope",),
    ),
    Kind(
        "environment",
        "cache_dir is a file",
        blocked(RUN, lambda p: p.write("f", "mine") and p.set("cache_dir", "f")),
        names=("cache_dir",),
    ),
    Kind(
        "environment",
        "QUANTUNE_CACHE_DIR=/proc/nope",
        env_setup({"QUANTUNE_CACHE_DIR": "/proc/nope"}),
        names=("/proc/nope",),
    ),
    Kind(
        "environment",
        "--output holds other files",
        blocked(RUN, lambda p: p.write("out/notes.txt", "mine")),
        names=("--output",),
    ),
    Kind(
        "environment",
        "--output holds a results.json not from quantune",
        blocked(RUN, lambda p: p.write("out/results.json", "{}") and p.write("out/best/model.onnx", "mine")),
        names=("--output",),
    ),
    Kind("environment", "read-only --output", mounted("1m", "out", read_only=True), names=("--output",)),
    Kind("environment", "full --output disk (200 KB)", mounted("200k", "out"), (1,), ("No space left", "disk")),
    Kind("environment", "full cache disk (1.6 MB)", mounted("1600k", "cache"), (1,), ("No space left", "disk")),
    Kind(
        "environment",
        "results.json deleted, resumed",
        twice(_rm("out/results.json")),
        (0,),
        after=_same_best,
        own_out=True,
    ),
    Kind("environment", "best/ deleted, resumed", twice(_rm("out/best")), (0,), after=_same_best, own_out=True),
    Kind(
        "environment",
        "run.db deleted, resumed",
        twice(_rm("out/run.db", "out/run.db-wal", "out/run.db-shm")),
        (0, 2),
        own_out=True,
    ),
    Kind(
        "environment",
        "quantune.log and workers/ deleted, resumed",
        twice(_rm("out/quantune.log", "out/workers")),
        (0,),
        after=_same_best,
        own_out=True,
    ),
    Kind("environment", "cache deleted, resumed", twice(_rm("cache")), (0,), after=_same_best, own_out=True),
    Kind("environment", "another config on the same --output", twice(_other_seed), names=("--restart",), own_out=True),
    Kind("environment", "cache inside --output", _cache_inside_output(False), (0,), after=_same_best, own_out=True),
    Kind(
        "environment",
        "cache inside --output, again with --restart",
        _cache_inside_output(True),
        (0,),
        after=_same_best,
        own_out=True,
    ),
    Kind("environment", "schema into a closed pipe", lambda p: ["|head", "schema"], (0,)),
    Kind("environment", "report on a folder with no run", lambda p: ["report", "."], names=("results.json", ".")),
    Kind(
        "environment",
        "check with no data files",
        lambda p: _rm("eval.npz", "calib.npz")(p) or (p.save_config() and ["check", "config.yaml"]),
        names=("eval.npz", "calib.npz"),
    ),
]
