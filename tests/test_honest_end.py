"""The run's end says what it knows: an undecided side-by-side timing is no "keep the original"
(the verdict never quotes a speed-up beyond the noise beside it), and a signal during the end's
re-timing or the report's drawing stops the run as it does during the search, saying what is kept.

Timings here are recorded figures or the run's own; signals are sent at events the run reaches
(a function entered), never after a sleep."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import quantune
from quantune.engine.measure.confirm import Confirmation
from quantune.engine.outcome.verdict import decide
from quantune.engine.trials.trial import TrialRecord
from quantune.evaluate import paired_ratio
from quantune.evaluate.paired import MIN_GAIN

ORIGINAL_S = np.full(5, 1.0e-3)


def _record(number: int, latency_ms: float, path: str) -> TrialRecord:
    return TrialRecord(
        number=number,
        flow=["static_quant"],
        params={"static_quant.weight_type": path},
        status="ok",
        metrics={"top1": 1.0, "latency_ms": latency_ms, "size_bytes": 100.0, "quantized_compute_ops": 1.0},
        meets_criterion=True,
        accuracy_loss=0.0,
        model_path=path,
    )


def _confirmed(*candidates: tuple[int, np.ndarray]) -> tuple[list[TrialRecord], Confirmation]:
    records = [_record(n, float(np.median(s)) * 1e3, f"{n}.onnx") for n, s in candidates]
    ratios = {n: paired_ratio(s, ORIGINAL_S) for n, s in candidates}
    return records, Confirmation(records, 1.0, rounds=len(ORIGINAL_S), ratios=ratios, ties=[records[0].number])


def test_an_undecided_side_by_side_timing_is_unconfirmed_not_keep_original() -> None:
    """Five rounds, four at 0.24x the original and one disturbed by other work at 1.05x: the median
    says 4x faster, the 90% interval (all five rounds) reaches above 0.98. Recorded, not timed."""
    rounds = ORIGINAL_S * np.array([0.24, 0.25, 0.23, 0.24, 1.05])
    records, confirmation = _confirmed((3, rounds))
    ratio = confirmation.ratios[3]
    assert not ratio.faster and ratio.median < 1.0 - MIN_GAIN  # a 4x gain measured, not decided
    verdict = decide(records, ["latency"], {"latency_ms": 1.0}, confirmation=confirmation)
    assert verdict.kind == "unconfirmed", verdict.reason
    assert verdict.best is records[0]
    assert "4.17x faster" in verdict.reason and "did not decide" in verdict.reason
    assert "0.230-1.050" in verdict.reason and "5 interleaved rounds" in verdict.reason
    assert "`quantune run`" in verdict.reason


@pytest.mark.parametrize(
    "factors",
    [
        [1.00, 1.01, 0.99, 1.02, 1.00],  # the same speed, decided: no gain
        [0.99, 1.30, 0.70, 1.10, 0.985],  # scattered, but the median is no gain beyond MIN_GAIN
    ],
    ids=["decided", "scattered-no-gain"],
)
def test_keep_original_never_quotes_a_gain_beyond_the_noise(factors) -> None:
    records, confirmation = _confirmed((2, ORIGINAL_S * np.array(factors)))
    verdict = decide(records, ["latency"], {"latency_ms": 1.0}, confirmation=confirmation)
    assert verdict.kind == "keep_original", verdict.reason
    assert confirmation.ratios[2].median >= 1.0 - MIN_GAIN


def test_a_surely_faster_candidate_is_improved_beside_an_undecided_one() -> None:
    sure = ORIGINAL_S * np.array([0.50, 0.51, 0.49, 0.50, 0.52])
    unsure = ORIGINAL_S * np.array([0.30, 0.31, 0.29, 0.30, 1.20])
    records, confirmation = _confirmed((4, sure), (6, unsure))
    verdict = decide(records, ["latency"], {"latency_ms": 1.0}, confirmation=confirmation)
    assert verdict.kind == "improved" and verdict.best is records[0]


def test_a_run_stopped_at_its_first_candidate_never_contradicts_itself(make_config, tmp_path: Path) -> None:
    """``stop.timeout_s: 0`` (stop at the first candidate) leaves a re-timing of a few seconds: whatever
    the machine's load made of its rounds, the verdict agrees with the ratio it quotes."""
    config = make_config(
        [{"name": "dynamic_quant", "params": {"weight_type": "int8"}}],
        evaluation={"metric": "top1", "latency": {"warmup": 1, "repeats": 5, "threads": 1, "confirm_top": 2}},
        stop={"timeout_s": 0, "max_trials": 2},
    )
    result = quantune.tune(config, tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["verdict"] == result.verdict
    confirmation = saved["latency_confirmation"]
    if confirmation is None or result.best is None:  # no candidate: nothing was timed side by side
        return
    ratio = confirmation["ratios"][str(result.best.number)]
    if result.verdict == "keep_original":
        assert ratio["ratio_median"] >= 1.0 - MIN_GAIN, result.verdict_reason
    elif result.verdict == "unconfirmed":
        assert "did not decide" in result.verdict_reason or "too few rounds" in result.verdict_reason
    else:
        assert result.verdict == "improved" and ratio["ratio_ci_high"] < 1.0 - MIN_GAIN


# The command line with one function of quantune held at its entry until a signal comes: it marks the
# event (a file), then runs the real function again and again -- the re-timing's real rounds, the
# page's real drawing -- so the signal the test sends on seeing the mark lands inside that stage.
HELD = """
import faulthandler, os, pathlib, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it stands, should it not stop
import {module} as where
real = where.{name}
def held(*args, **kwargs):
    pathlib.Path(os.environ["QUANTUNE_TEST_MARK"]).touch()
    while True:
        real(*args, **kwargs)
where.{name} = held
from quantune.cli import entry
entry()
"""


def _held_run(tmp_path: Path, module: str, name: str, signum: int, **env: str) -> tuple[int, str, Path]:
    import contextlib
    import os
    import signal
    import subprocess
    import sys

    from robust_helpers import PYTHON, cli_env, kill_session, make_project, wait_for

    config = make_project(
        tmp_path / "project",
        max_trials=2,
        executor={"kind": "inline"},
        evaluation={"metric": "top1", "latency": {"warmup": 1, "repeats": 5, "threads": 1, "confirm_top": 1}},
    )
    output, mark = tmp_path / "out", tmp_path / "mark"
    proc = subprocess.Popen(
        [PYTHON, "-c", HELD.format(module=module, name=name), "run", str(config), "--output", str(output)],
        cwd=config.parent,
        env=cli_env(QUANTUNE_TEST_MARK=str(mark), **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(mark.exists, process=proc, what=f"{name} to be entered")
        os.kill(proc.pid, signum)
        try:
            _, err = proc.communicate(timeout=600)  # bounds only a broken test: it waits for the exit
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGUSR1)  # its threads' stacks, for the failure's message
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=5)
            kill_session(proc.pid)
            _, err = proc.communicate()
            raise AssertionError(f"the run did not stop on the signal: {err[-8000:]}") from None
    finally:
        if proc.poll() is None:
            kill_session(proc.pid)
    assert sys.executable  # the same interpreter as the suite's
    return proc.returncode, err, output


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="signals a real run (robust_helpers reads /proc)")
def test_ctrl_c_during_the_retiming_exits_130_with_an_unconfirmed_answer(tmp_path: Path) -> None:
    import signal

    code, err, output = _held_run(tmp_path, "quantune.engine.run.ending", "confirm_latency", signal.SIGINT)
    assert code == 130, err
    assert "Traceback" not in err
    results = json.loads((output / "results.json").read_text())
    assert results["stop_reason"].startswith("interrupted (Ctrl-C) during the latency re-timing")
    # the search's figures decide whether the answer is unconfirmed (a faster candidate) or the original
    # (every candidate slower), as after a Ctrl-C during the search; either way the reason says why
    assert results["verdict"] in ("unconfirmed", "keep_original")
    assert "interrupted (Ctrl-C) while it was re-timed side by side" in results["verdict_reason"]
    assert len(results["trials"]) >= 1


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="signals a real run (robust_helpers reads /proc)")
def test_sigterm_while_the_report_is_drawn_keeps_results_and_says_how_to_draw_it(tmp_path: Path) -> None:
    import signal

    code, err, output = _held_run(tmp_path, "quantune.report.html", "render_html", signal.SIGTERM, QUANTUNE_REPORT="1")
    assert code == 143, err
    assert "Traceback" not in err
    assert json.loads((output / "results.json").read_text())["verdict"]  # the run's answer is written
    assert not (output / "report.html").exists()
    assert not list(output.glob(".report.html*")), "no half-written page is left"
    assert f"`quantune report {output}` draws the page" in err
