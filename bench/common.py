"""What every bench process shares: the case file, data, metrics, and one way to measure a model.

This module needs only numpy and onnxruntime, so it runs unchanged in quantune's venv and in
every peer's venv (Neural Compressor, NNCF, Olive, Quark). Peers import it by path.

A *case* is a JSON file written by ``bench/run.py``::

    {"name": "digits", "model": "/abs/model.onnx", "calibration": "/abs/calib.npz",
     "evaluation": "/abs/eval.npz", "metric": "top1" | "/abs/metric.py:function",
     "label_key": "label", "batch_size": 64, "higher_is_better": true,
     "tolerable_loss": 0.01, "baseline": 0.9867, "max_trials": 16, "timeout_s": 600,
     "input_names": ["input"], "calibration_samples": 256}

Data is an ``.npz`` of arrays (batched along axis 0) or, for models whose inputs differ in
shape from one sample to the next (the zoo's recognizers, taggers, encoders), an ``.npz`` of
*feeds* (keys ``<index>/<name>``, as ``bench/zoo/zoolib.save_feeds`` writes): each feed is
run on its own and the metric sees every output stacked when the shapes allow, else a list.

Clock: the harness puts the wall-clock time it started the tool's process in ``BENCH_T0``;
every time a tool reports (first model in budget) counts from there, the same point for
every tool, its imports and its own fp32 evaluation included. ``BENCH_PROGRESS`` names a file
the scorer appends each evaluation to, so a tool killed at the limit still has its record.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import onnxruntime as ort

Metric = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], float]


def load_case(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as archive:
        return {key: archive[key] for key in archive.files}


Data = dict[str, np.ndarray] | list[dict[str, np.ndarray]]


def load_data(path: str | Path) -> Data:
    """An ``.npz`` of arrays, or of feeds (``<index>/<name>`` keys): then a list of feed dicts."""
    arrays = load_npz(path)
    if not arrays or not all("/" in key for key in arrays):
        return arrays
    feeds: dict[int, dict[str, np.ndarray]] = {}
    for key, value in arrays.items():
        index, _, name = key.partition("/")
        feeds.setdefault(int(index), {})[name] = value
    return [feeds[i] for i in sorted(feeds)]


def stack(parts: list[np.ndarray]) -> np.ndarray | list[np.ndarray]:
    """Concatenated along axis 0 when the parts agree after it (as quantune does), else the list."""
    first = parts[0]
    if all(p.ndim >= 1 and p.shape[1:] == first.shape[1:] and p.dtype == first.dtype for p in parts):
        return np.concatenate(parts, axis=0)
    return list(parts)


def view(data: Data) -> dict:
    """What a metric sees as its data: the arrays, or each feed key stacked (or listed)."""
    if isinstance(data, dict):
        return data
    return {name: stack([feed[name] for feed in data]) for name in data[0]}


def clock_start() -> float:
    """The wall-clock time the harness started this tool's process (now, when run by hand)."""
    return float(os.environ.get("BENCH_T0", time.time()))


def progress(entry: dict) -> None:
    """Appends one evaluation to the harness's progress file (kept when the tool is killed)."""
    path = os.environ.get("BENCH_PROGRESS")
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps(entry) + "\n")


def top1(outputs: dict[str, np.ndarray], data: dict[str, np.ndarray], label_key: str = "label") -> float:
    first = next(iter(outputs.values()))
    return float(np.mean(np.argmax(first, axis=-1).reshape(-1) == data[label_key].reshape(-1)))


def load_metric(spec: str, label_key: str = "label") -> Metric:
    """``top1`` or ``/path/to/script.py:function`` (same call signature as quantune's metrics)."""
    if spec == "top1":
        return lambda outputs, data: top1(outputs, data, label_key)
    script, _, name = spec.rpartition(":")
    module_spec = importlib.util.spec_from_file_location(f"bench_metric_{Path(script).stem}", script)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module
    module_spec.loader.exec_module(module)
    return getattr(module, name)


def input_names(model_path: str | Path) -> list[str]:
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return [item.name for item in session.get_inputs()]


def batches(data: Data, names: list[str], batch_size: int, limit: int | None = None) -> Iterator[dict]:
    if isinstance(data, list):  # feeds: one at a time, whatever batch_size says
        for feed in data[:limit]:
            yield {name: feed[name] for name in names}
        return
    total = len(data[names[0]]) if limit is None else min(limit, len(data[names[0]]))
    for start in range(0, total, batch_size):
        yield {name: data[name][start : start + batch_size] for name in names}


def run_model(model_path: str | Path, data: Data, batch_size: int, runtime: dict | None = None) -> dict:
    """All outputs of the model over ``data``, concatenated along the batch axis (a list per
    output when feeds' outputs differ in shape), on the row's ``runtime`` (default: onnxruntime CPU)."""
    run, names, outs = open_model(model_path, runtime, timing=False)
    chunks: list[list[np.ndarray]] = [[] for _ in outs]
    for batch in batches(data, names, batch_size):
        for index, value in enumerate(run(batch)):
            chunks[index].append(value)
    return {name: stack(parts) for name, parts in zip(outs, chunks, strict=True)}


# what every OpenVINO row is compiled with for timing (the bench's one-thread latency setting)
OPENVINO_TIMING = {
    "INFERENCE_NUM_THREADS": 1,
    "NUM_STREAMS": 1,
    "PERFORMANCE_HINT": "LATENCY",
    "ENABLE_CPU_PINNING": False,
}


def open_model(
    model_path: str | Path, runtime: dict | None = None, timing: bool = True
) -> tuple[Callable[[dict], list], list[str], list[str]]:
    """``(run, input names, output names)`` for a model on its runtime, ``run(feeds)`` -> outputs.

    ``runtime`` is a row's ``{"name": "onnxruntime"}`` (the default: the CPU provider) or
    ``{"name": "openvino", "config": {...}}`` (OpenVINO's own runtime on its CPU plugin, an IR
    ``.xml`` or an ONNX file; ``config`` the compile properties the row was scored with, e.g.
    ``INFERENCE_PRECISION_HINT``). ``timing``: the bench's one-thread latency setting.
    """
    runtime = runtime or {"name": "onnxruntime"}
    if runtime["name"] == "onnxruntime":
        session = _timing_session(model_path) if timing else _eval_session(model_path)
        outs = [item.name for item in session.get_outputs()]
        return (lambda feeds: session.run(outs, feeds)), [i.name for i in session.get_inputs()], outs
    if runtime["name"] != "openvino":
        raise ValueError(f"unknown runtime {runtime['name']!r} (onnxruntime or openvino)")
    import openvino as ov  # only in the venvs that have it (venv-nncf)

    config = {**runtime.get("config", {}), **(OPENVINO_TIMING if timing else {})}
    core = ov.Core()
    model = core.read_model(str(model_path))
    # the names as the model file has them: a compiled model merges the names of fused tensors
    # (an NNCF IR's output "461" becomes {"/model/Div_output_0", "461"}) and get_any_name picks either
    outs = [port.get_any_name() for port in model.outputs]
    compiled = core.compile_model(model, "CPU", config)
    request = compiled.create_infer_request()

    def run(feeds: dict) -> list:
        result = request.infer(feeds)
        return [np.array(result[port]) for port in compiled.outputs]

    return run, [port.get_any_name() for port in model.inputs], outs


def _eval_session(model_path: str | Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])


def _timing_session(model_path: str | Path) -> ort.InferenceSession:
    """CPU provider, 1 intra-op thread, sequential, no spinning: the one way every model is timed."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])


def latency_ms(
    model_path: str | Path,
    feeds: dict[str, np.ndarray],
    warmup: int = 20,
    repeats: int = 100,
    runtime: dict | None = None,
) -> dict:
    """The one latency method (see :func:`latency_interleaved`) for a single model: median and p90."""
    return latency_interleaved({"model": (model_path, runtime)}, feeds, warmup=warmup, repeats=repeats)["model"]


def latency_interleaved(
    models: dict[str, str | Path | tuple], feeds: dict[str, np.ndarray], warmup: int = 20, repeats: int = 100
) -> dict[str, dict]:
    """Median and p90 latency (ms) of several models on a fixed batch, timed in interleaved rounds.

    On a shared or throttled machine, timing one model after another lets a slow minute land
    on one tool; one run of every model per round (in rotating order) gives each the same
    conditions, so the ratios between tools are fair. A model is a path (onnxruntime CPU) or
    ``(path, runtime)`` (see :func:`open_model`): every one is timed on its own runtime, one
    thread, in the same rounds of the same process.
    """
    runners = {}
    for name, entry in models.items():
        path, runtime = entry if isinstance(entry, tuple) else (entry, None)
        runners[name] = open_model(path, runtime)[0]
    for run in runners.values():
        for _ in range(warmup):
            run(feeds)
    names = list(runners)
    timings = {name: np.empty(repeats) for name in names}
    for index in range(repeats):
        for offset in range(len(names)):
            name = names[(index + offset) % len(names)]
            start = time.perf_counter()
            runners[name](feeds)
            timings[name][index] = time.perf_counter() - start
    return {
        name: {"latency_ms": float(np.median(t) * 1000), "latency_p90_ms": float(np.percentile(t, 90) * 1000)}
        for name, t in timings.items()
    }


def meets(case: dict, value: float) -> bool:
    """The case's budget: relative loss vs the fp32 figure at most ``tolerable_loss``."""
    return relative_loss(case, value) <= case["tolerable_loss"] + 1e-12


def relative_loss(case: dict, value: float) -> float:
    base = case["baseline"]
    loss = (base - value) if case.get("higher_is_better", True) else (value - base)
    return loss / abs(base)


class Scorer:
    """The accuracy function every peer's tuner calls; it counts calls and notes the first feasible one.

    ``score(path)`` evaluates a model file; ``score_proto(model)`` an in-memory ``onnx.ModelProto``
    (saved to a temporary file first, with external data when it is large).
    """

    def __init__(self, case: dict) -> None:
        self.case = case
        self.data = load_data(case["evaluation"])
        self.metric = load_metric(case["metric"], case.get("label_key", "label"))
        self.started = clock_start()
        self.calls = 0
        self.first_feasible_s: float | None = None
        self.history: list[dict] = []
        self.first_feasible_evaluations: int | None = None  # evaluations (fp32 baseline not counted) to it

    @property
    def evaluations(self) -> int:
        """Full evaluations of candidates: the calls less the tool's own fp32 baseline."""
        return max(0, self.calls - 1)

    def restart_clock(self) -> None:
        """Kept for the tools' calls; the clock runs from the process start (``BENCH_T0``) for all."""

    def score(self, model_path: str | Path, runtime: dict | None = None) -> float:
        return self.score_outputs(run_model(model_path, self.data, self.case["batch_size"], runtime))

    def score_outputs(self, outputs: dict) -> float:
        """Scores outputs the tool computed itself over the whole split (e.g. OpenVINO's compiled model)."""
        value = float(self.metric(outputs, view(self.data)))
        self.calls += 1
        elapsed = time.time() - self.started
        feasible = meets(self.case, value)
        entry = {"call": self.calls, "value": value, "feasible": feasible, "t_s": elapsed}
        # the first call is the tool's own fp32 baseline: it does not count as a found model
        if feasible and self.calls > 1 and self.first_feasible_s is None:
            self.first_feasible_s = elapsed
            self.first_feasible_evaluations = self.calls - 1
            entry["first_feasible"] = True
        self.history.append(entry)
        progress(entry)
        return value

    def score_proto(self, model) -> float:
        import onnx

        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "model.onnx"
            large = model.ByteSize() > 1_800_000_000
            onnx.save_model(model, str(path), save_as_external_data=large)
            return self.score(path)


def stop_by_limits(found: bool, evaluations: int, case: dict, total_s: float, otherwise: str) -> str:
    """What ended a peer's search that returns a model or none without saying why: its trial
    limit, its own time limit, or ``otherwise`` (e.g. "search space exhausted")."""
    kept = "best in-budget model kept" if found else "budget missed"
    if evaluations >= case["max_trials"]:
        return f"trial limit ({case['max_trials']}) reached, {kept}"
    if total_s >= case["timeout_s"]:
        return f"own time limit ({case['timeout_s']:.0f} s) reached, {kept}"
    return f"{otherwise} after {evaluations} evaluation(s), {kept}"


def accuracy_control_stop(scorer: Scorer, case: dict, candidates: int) -> str:
    """What ended NNCF's accuracy control (its first score is the fully quantized model, then one
    per revert, ``max_num_iterations`` = the trial limit), from its scores."""
    scores = scorer.history[1 : 1 + candidates]
    if scores and scores[-1]["feasible"]:
        return f"accuracy reached after {candidates} evaluation(s)"
    if candidates - 1 >= case["max_trials"]:
        return f"trial limit ({case['max_trials']} reverts) reached, budget missed"
    return "nothing left to revert, budget missed"


def calibration_batches(case: dict, batch_size: int = 1) -> list[dict[str, np.ndarray]]:
    data = load_data(case["calibration"])
    names = case["input_names"]
    limit = case.get("calibration_samples")
    return list(batches(data, names, batch_size, limit))


def write_result(out_dir: str | Path, payload: dict) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "result.json.tmp"
    tmp.write_text(json.dumps(payload, indent=2, default=str))
    os.replace(tmp, out / "result.json")
