"""Real projects and real processes for the robustness tests and bench/fault_soak.py.

A project is a folder holding the tiny CNN, its data and a YAML config whose static_quant space
has ~100 points (enough trials to signal or kill a run in the middle of its search).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from conftest import build_cnn, cnn_inputs, run_model

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
# The latency lane is machine-wide (/tmp/quantune-latency.lock): a run elsewhere on this machine
# holding it would stall these runs for as long as it times its models. These runs share a lane
# of their own.
PRIVATE_LATENCY_LOCK = os.path.join(tempfile.gettempdir(), f"quantune-latency-robust-{os.getpid()}.lock")


def make_project(
    folder: Path, *, max_trials: int = 60, executor: dict[str, Any] | None = None, **overrides: Any
) -> Path:
    """Writes ``folder``/{cnn.onnx, calib.npz, eval.npz, config.yaml}; returns the config's path."""
    folder.mkdir(parents=True, exist_ok=True)
    model = build_cnn(folder / "cnn.onnx")
    calib = cnn_inputs(32, seed=1)
    evaluation = cnn_inputs(32, seed=2)
    labels = np.argmax(run_model(model, {"input": evaluation})[0], axis=1).astype(np.int64)
    np.savez(folder / "calib.npz", input=calib)
    np.savez(folder / "eval.npz", input=evaluation, label=labels)
    config: dict[str, Any] = {
        "model": "cnn.onnx",
        "data": {"calibration": "calib.npz", "evaluation": "eval.npz", "batch_size": 16},
        "evaluation": {"metric": "top1", "latency": {"warmup": 1, "repeats": 2, "threads": 1, "confirm_top": 0}},
        "criterion": {"type": "relative", "tolerable_loss": 0.5},
        "objective": "latency",
        "passes": [{"name": "static_quant", "search": True, "params": {"calibration_samples": 16}}],
        "search": {"sampler": "random", "seed": 0},
        "stop": {"max_trials": max_trials},
        "cache_dir": "cache",
        "executor": executor or {"kind": "process", "workers": 1},
    }
    config.update(overrides)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["ORT_DISABLE_TELEMETRY"] = "1"
    env["QUANTUNE_LATENCY_LOCK"] = PRIVATE_LATENCY_LOCK
    env.update(extra)
    return env


def start_run(config: Path, output: Path, *args: str, **popen: Any) -> subprocess.Popen[str]:
    """``quantune run`` in a new session (its own process group), output captured."""
    return subprocess.Popen(
        [PYTHON, "-m", "quantune.cli", "run", str(config), "--output", str(output), "--quiet", *args],
        cwd=config.parent,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen,
    )


def quantune(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "quantune.cli", *args], cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=timeout
    )


def stored_trials(output: Path) -> int:
    """Trials in ``output``/run.db (0 while it does not exist yet)."""
    db = output / "run.db"
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
    except sqlite3.Error:
        return 0


def wait_for(condition, timeout: float = 300, what: str = "condition", process: subprocess.Popen | None = None) -> None:
    """Polls ``condition`` (a synchronisation point, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process is not None and process.poll() is not None:
            _out, err = process.communicate()
            raise AssertionError(f"the run ended (exit {process.returncode}) before {what}: {err[-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class LaneGate:
    """The runs' private latency lane (``PRIVATE_LATENCY_LOCK``), held by the test: a run whose
    original is evaluated already (``quantune check`` first) claims its output folder and then waits
    at its first timing, and :meth:`let_one_through` lets exactly the timing waiting now pass. A test
    that must stop a run in the middle of its search does so on these events, not on its speed."""

    def __init__(self, path: str = PRIVATE_LATENCY_LOCK) -> None:
        from quantune.evaluate.latency import LatencyLane

        self.lane = LatencyLane(Path(path), say=lambda _: None)

    def __enter__(self) -> LaneGate:
        self.lane.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        self.lane.release()

    def wait_for_a_timing(self, process: subprocess.Popen | None = None) -> None:
        wait_for(lambda: bool(self.lane.waiters()), process=process, what="a timing waiting for the lane")

    def let_one_through(self, process: subprocess.Popen | None = None) -> None:
        """The timing waiting now (waited for) takes the lane; this returns once it has released it."""
        self.wait_for_a_timing(process)
        waiting = self.lane.waiters()
        self.lane.release()
        wait_for(lambda: not any(marker.exists() for marker in waiting), process=process, what="it to take the lane")
        self.lane.acquire()  # queues behind it: back once its timing is over


def descendants(pid: int) -> list[int]:
    """Live processes whose parent chain includes ``pid`` (read from /proc), and processes of its session."""
    parents: dict[int, int] = {}
    sessions: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":  # a zombie has exited; only its parent has yet to reap it
            continue
        parents[int(entry.name)] = int(fields[1])
        sessions[int(entry.name)] = int(fields[3])
    found = {p for p, s in sessions.items() if s == pid and p != pid}
    changed = True
    while changed:
        changed = False
        for child, parent in parents.items():
            if child not in found and (parent == pid or parent in found):
                found.add(child)
                changed = True
    return sorted(found)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kill_session(pid: int) -> None:
    """Cleans up after a failed test: SIGKILL to the run's session (only processes this test started)."""
    for child in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def counted(trials: list[dict[str, Any]]) -> int:
    """Trials that count against ``stop.max_trials``: a trial whose model an earlier trial already
    produced (``stage`` says "duplicate of trial N") does not."""
    return sum("(duplicate of trial" not in (trial.get("stage") or "") for trial in trials)


def metric_for_candidates(action: str) -> str:
    """A top-1 metric script that does ``action`` (a statement: ``return float("nan")``,
    ``time.sleep(10**6)``) for every model but the first it scores -- the original: the preflight
    and the baseline evaluate it first, and its outputs do not change between runs."""
    return f"""
import hashlib
import os
import time

import numpy as np

FIRST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "first_outputs.txt")


def score(outputs, data):
    logits = next(iter(outputs.values()))
    digest = hashlib.sha256(np.ascontiguousarray(logits).tobytes()).hexdigest()
    if not os.path.exists(FIRST):
        with open(FIRST, "w") as handle:
            handle.write(digest)
    with open(FIRST) as handle:
        if handle.read() != digest:
            {action}
    return float(np.mean(np.argmax(logits, axis=1) == data["label"]))
"""


def qdq_quantized(model: Path, x, out: Path) -> Path:
    """``model`` quantized by onnxruntime (QDQ), calibrated on ``x`` (its input ``x``) in batches of 4."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter([{"x": x[i : i + 4]} for i in range(0, len(x), 4)])

        def get_next(self):
            return next(self.items, None)

    quantize_static(str(model), str(out), Reader(), quant_format=QuantFormat.QDQ)
    return out


def built_loop(config: dict[str, Any], store: Path, budget: Any, **given: Any) -> Any:
    """A run loop built whole, as the search phase builds it, over ``config`` (its ``stop`` as given,
    its trials in this process, nothing replayed, no listener) with ``budget``, a ``TimeBudget``,
    and ``given`` (``evaluated_ahead``, ...) as the loop's keyword arguments."""
    from quantune.config import load_config
    from quantune.engine.executors import InProcessExecutor
    from quantune.engine.run.loop import Judge, RunLoop
    from quantune.engine.run.resume import Replay
    from quantune.engine.trials.runner import TrialRunner
    from quantune.engine.trials.setup import build_run
    from quantune.store import RunStore
    from quantune.strategy import create_strategy

    loaded = load_config(config)
    parts = build_run(loaded)
    judge = Judge(parts.criterion, loaded.config.evaluation.metric, ["latency"])
    executor = InProcessExecutor(TrialRunner(parts.context))
    return RunLoop(
        judge,
        parts.plan,
        loaded.config.stop,
        [],
        create_strategy("joint"),
        executor,
        RunStore(store),
        Replay([]),
        {},
        budget,
        **given,
    )
