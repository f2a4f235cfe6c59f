"""An evaluation too small for its budget is said, and a loss within the evaluation's sampling noise
is said: a top-1 figure moves one row at a time, and a candidate's changed rows against the
original's are tested exactly (sign test on the discordant rows). Tiny CNN, real onnxruntime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import quantune
from conftest import build_cnn, cnn_inputs, run_model
from quantune.data import Dataset
from quantune.engine.outcome.verdict import decide
from quantune.engine.trials.trial import TrialRecord
from quantune.evaluate import EvaluationSpec, Evaluator
from quantune.evaluate.feeds import pack
from quantune.evaluate.rows import sign_test_p


def test_the_sign_test_is_exact_on_the_discordant_rows() -> None:
    assert sign_test_p(0, 0) == 1.0  # no row changed: nothing to tell
    assert sign_test_p(1, 0) == 1.0  # one row either way is a coin's toss
    assert sign_test_p(5, 0) == pytest.approx(2 / 32)  # all five one way: still not below 5%
    assert sign_test_p(6, 0) == pytest.approx(2 / 64)
    assert sign_test_p(7, 2) == sign_test_p(2, 7) == pytest.approx(2 * (1 + 9 + 36) / 512)
    assert 0.0 < sign_test_p(3000, 2000) < 1e-40  # thousands of rows: no overflow


def test_a_candidate_is_paired_with_the_original_row_by_row(tmp_path: Path) -> None:
    original, other = build_cnn(tmp_path / "a.onnx", seed=0), build_cnn(tmp_path / "b.onnx", seed=3)
    inputs = cnn_inputs(40, seed=2)
    mine = np.argmax(run_model(original, {"input": inputs})[0], axis=1)
    theirs = np.argmax(run_model(other, {"input": inputs})[0], axis=1)
    labels = mine.copy()
    labels[:5] = theirs[:5]  # rows the original gets wrong where the other model may be right
    evaluator = Evaluator(
        EvaluationSpec(metric="top1", batch_size=16), Dataset({"input": inputs, "label": labels}, "t"), ["input"]
    )
    first = evaluator.measure(original)
    base = evaluator.figures(first, None)
    assert base["rows_scored"] == 40 and "rows_worse" not in base
    figures = evaluator.figures(evaluator.measure(other), pack(first.outputs))
    right_a, right_b = mine == labels, theirs == labels
    assert figures["rows_worse"] == np.sum(right_a & ~right_b)
    assert figures["rows_better"] == np.sum(right_b & ~right_a)
    assert figures["loss_p_value"] == sign_test_p(int(figures["rows_worse"]), int(figures["rows_better"]))
    assert figures["top1"] == pytest.approx(base["top1"] + (figures["rows_better"] - figures["rows_worse"]) / 40)

    # against the original's own arg-max every changed row is a worse one
    agreement = Evaluator(
        EvaluationSpec(metric="top1_agreement", batch_size=16), Dataset({"input": inputs}, "t"), ["input"]
    )
    reference = agreement.measure(original)
    agreed = agreement.figures(agreement.measure(other), pack(reference.outputs))
    assert agreed["rows_worse"] == np.sum(mine != theirs) > 0 and agreed["rows_better"] == 0


def test_a_budget_finer_than_one_row_is_said_at_check(make_config, tmp_path: Path, capsys) -> None:
    """One evaluation row: a 1% budget is a hundredth of a row, so the data cannot resolve it."""
    model = build_cnn(tmp_path / "one.onnx")
    row = cnn_inputs(1, seed=4)
    np.savez(tmp_path / "one.npz", input=row, label=np.argmax(run_model(model, {"input": row})[0], axis=1))
    config = make_config(criterion={"type": "relative", "tolerable_loss": 0.01})
    config["model"], config["data"]["evaluation"] = str(model), str(tmp_path / "one.npz")
    quantune.check(config)
    err = capsys.readouterr().err
    assert "quantune: warning: criterion.tolerable_loss: 0.01 (relative)" in err
    assert "finer than one row" in err and "at least 100 rows" in err


def test_a_budget_of_whole_rows_is_not_warned(make_config, capsys) -> None:
    """48 rows scored 1.0: a 50% budget is 24 rows."""
    quantune.check(make_config())
    assert "finer than one row" not in capsys.readouterr().err


def _record(number: int, loss: float, worse: int, better: int, rows: int = 20) -> TrialRecord:
    return TrialRecord(
        number=number,
        flow=["dynamic_quant"],
        params={},
        status="ok",
        metrics={
            "top1": 0.9 - loss,
            "latency_ms": 1.0,
            "size_bytes": 50.0,
            "quantized_ops": 3,
            "rows_scored": float(rows),
            "rows_worse": float(worse),
            "rows_better": float(better),
            "loss_p_value": sign_test_p(worse, better),
        },
        meets_criterion=True,
        accuracy_loss=loss,
        objective=50.0,
    )


def test_the_verdict_says_when_the_loss_is_within_the_sampling_noise() -> None:
    baseline = {"top1": 0.9, "latency_ms": 1.0, "size_bytes": 100.0}
    within = decide([_record(0, 0.05, worse=1, better=0)], ["size"], baseline)
    assert within.kind == "improved"
    assert "within the evaluation's sampling noise (1 of 20 rows worse, 0 better; exact sign test p = 1.00)" in (
        within.reason
    )
    beyond = decide([_record(0, 0.3, worse=6, better=0)], ["size"], baseline)
    assert "sampling noise" not in beyond.reason  # a real loss, within the budget: nothing to add
    unchanged = decide([_record(0, 0.0, worse=0, better=0)], ["size"], baseline)
    assert "sampling noise" not in unchanged.reason


def test_more_accurate_by_one_row_is_no_improvement() -> None:
    """One row better of twenty is a coin's toss: the original stays; six rows better is not."""
    baseline = {"top1": 0.9, "latency_ms": 1.0, "size_bytes": 100.0}
    noise = decide([_record(0, -0.05, worse=0, better=1)], ["accuracy"], baseline, loss_kind="absolute")
    assert noise.kind == "keep_original" and "beyond the evaluation's sampling noise" in noise.reason
    real = decide([_record(0, -0.3, worse=0, better=6)], ["accuracy"], baseline, loss_kind="absolute")
    assert real.kind == "improved"


def test_a_run_records_each_candidates_paired_test(make_config, tmp_path: Path) -> None:
    result = quantune.tune(make_config(stop={"max_trials": 2}), tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["baseline"]["rows_scored"] == 48
    ok = [t for t in saved["trials"] if t["status"] == "ok"]
    assert ok and all({"rows_worse", "rows_better", "loss_p_value"} <= set(t["metrics"]) for t in ok)
    if result.best is not None and "sampling noise" in result.verdict_reason:
        assert result.best.metrics["loss_p_value"] >= 0.05
