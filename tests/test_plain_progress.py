"""Without a terminal (a CI log, ``| tee``) every long stage prints plain progress lines: when it
starts, how far it is, when it ends, and a heartbeat while it reports nothing. The lines are
counted per stage; nothing here depends on how long a stage takes."""

from __future__ import annotations

import io
import subprocess
import threading
from functools import partial
from pathlib import Path

import numpy as np
import onnx
from rich.console import Console

from quantune import progress
from quantune.engine.executors.stage import Isolation, run_stage
from quantune.evaluate.sensitivity import capture, measure
from quantune.evaluate.sensitivity.static import _structure
from quantune.report.console import ConsoleListener
from quantune.report.heartbeat import PlainProgress
from robust_helpers import PYTHON, cli_env, make_project, qdq_quantized
from test_memory import build_wide_cnn


def _lines(text: str, stage: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"{stage}: ")]


def test_a_run_without_a_terminal_prints_each_stage_in_plain_lines(tmp_path: Path):
    evaluation = {"metric": "top1", "latency": {"warmup": 1, "repeats": 5, "threads": 1, "confirm_top": 2}}
    config = make_project(tmp_path / "project", max_trials=3, evaluation=evaluation)
    run = subprocess.run(  # stderr, where the console writes, is a pipe here: no terminal; lines on stdout
        [PYTHON, "-m", "quantune.cli", "run", str(config), "--output", str(tmp_path / "out")],
        cwd=config.parent,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    err = run.stdout
    assert not [line for line in run.stderr.splitlines() if line.startswith("tuning: ")]  # stderr: errors only
    preparing = _lines(err, "preparing the model")  # the set-up says so before the original's evaluation
    assert preparing[0] == "preparing the model: started" and preparing[-1].startswith("preparing the model: done")
    assert err.index("preparing the model: started") < err.index("baseline evaluation: started")
    original = _lines(err, "baseline evaluation")
    assert original[0] == "baseline evaluation: started" and original[-1].startswith("baseline evaluation: done")
    assert any("2/2 evaluation batches" in line for line in original)  # the worker's events, forwarded
    assert any("5/5 rounds" in line for line in original)
    trials = _lines(err, "tuning")
    assert trials[0].startswith("tuning: 0/3 trials") and any(line.startswith("tuning: 3/3 trials") for line in trials)
    assert trials[-1].startswith("tuning: done")
    confirmation = _lines(err, "confirmation")
    assert confirmation[0] == "confirmation: started" and confirmation[-1].startswith("confirmation: done")
    assert any("rounds" in line for line in confirmation)


def test_a_stage_worker_reports_how_far_it_is_to_the_console(tmp_path: Path):
    model = build_wide_cnn(tmp_path / "wide.onnx", size=16)
    x = np.random.default_rng(0).normal(0, 1, (8, 3, 16, 16)).astype(np.float32)
    quant = qdq_quantized(model, x, tmp_path / "q.onnx")
    feeds = [{"x": x[i : i + 4]} for i in range(0, 8, 4)]
    tiny = 0.01  # MB: one capture group per job
    jobs = _structure(onnx.load(str(model)), onnx.load(str(quant))).jobs
    groups = len(capture.plan(jobs, onnx.load(str(model)), onnx.load(str(quant)), lambda: iter(feeds), tiny).groups)
    assert groups > 2
    out = io.StringIO()
    listener = ConsoleListener(Console(file=io.StringIO(), force_terminal=False), Console(file=out, width=200))
    with listener.showing_stages():
        outcome = run_stage(
            "sensitivity", partial(measure, budget_mb=tiny), model, quant, feeds, isolation=Isolation(tmp_path)
        )
    assert outcome.ok, outcome.error
    lines = _lines(out.getvalue(), "sensitivity")
    assert lines[0] == "sensitivity: started" and lines[-1].startswith("sensitivity: done")
    assert any(f"{groups}/{groups} capture groups" in line for line in lines)  # the last event always prints


def test_a_stage_that_reports_nothing_still_gets_a_heartbeat():
    lines: list[str] = []
    seen = threading.Event()

    def write(line: str) -> None:
        lines.append(line)
        if line.startswith("calibration: running"):
            seen.set()

    plain = PlainProgress(write, heartbeat_s=0.05)
    plain.start()
    try:
        with progress.listening(plain), progress.stage("calibration"):
            assert seen.wait(120), lines  # the bound only ends a broken test
    finally:
        plain.stop()
    assert lines[0] == "calibration: started" and lines[-1].startswith("calibration: done")
