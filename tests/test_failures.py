"""Failing trials are data, and a run where nothing meets the criterion says so."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import quantune
from conftest import run_model
from quantune import Categorical

TOY = "test_toy"


class ToyConfig(quantune.PassConfig):
    mode: Literal["copy", "fail", "nothing", "garbage", "negate", "roll"] = "copy"


@quantune.register_pass
class ToyPass(quantune.Pass):
    """A pass for tests: copies the model, breaks it in a chosen way, or raises."""

    name = TOY
    Config = ToyConfig
    search_space = {"mode": Categorical(("copy", "negate"))}

    def run(self, config, model_in, model_out, context):
        if config.mode == "fail":
            raise RuntimeError("toy failure on purpose")
        if config.mode == "nothing":
            return
        if config.mode == "garbage":
            Path(model_out).write_bytes(b"this is not an onnx model")
            return
        model = onnx.load(str(model_in))
        if config.mode in ("negate", "roll"):
            for init in model.graph.initializer:
                if init.name in ("wf", "bf"):
                    array = numpy_helper.to_array(init)
                    array = -array if config.mode == "negate" else np.roll(array, 1, axis=0)
                    init.CopyFrom(numpy_helper.from_array(array, init.name))
        onnx.save(model, str(model_out))


def toy_flow(modes: list[str]) -> list[dict]:
    return [{"name": TOY, "params": {"mode": {"search": modes}}}]


def read_results(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


def test_failing_trials_are_recorded_and_the_run_completes(make_config, tmp_path, cnn_model):
    model_bytes = cnn_model.read_bytes()
    config = make_config(toy_flow(["copy", "fail", "nothing", "garbage"]))
    out = tmp_path / "out"
    result = quantune.tune(config, output=out)

    by_mode = {trial.params[f"{TOY}.mode"]: trial for trial in result.trials}
    assert set(by_mode) == {"copy", "fail", "nothing", "garbage"}
    assert [t.number for t in result.trials] == [0, 1, 2, 3]

    ok = by_mode["copy"]
    assert ok.status == "ok" and ok.error is None
    assert ok.meets_criterion is True
    assert ok.accuracy_loss == pytest.approx(0.0)

    for mode in ("fail", "nothing"):
        failed = by_mode[mode]
        assert failed.status == "failed"
        assert TOY in failed.error, f"the error must name the pass: {failed.error!r}"
        assert failed.meets_criterion is not True
        assert not failed.metrics
    assert "toy failure on purpose" in by_mode["fail"].error
    # A model onnxruntime cannot load fails at evaluation, not as a crash of the run.
    assert by_mode["garbage"].status == "failed"
    assert by_mode["garbage"].error

    # the copy meets the criterion but quantizes nothing: the original in disguise, no candidate
    assert ok.metrics["quantized_ops"] == 0
    assert result.best is None and result.verdict == "no_candidate_in_budget"
    assert f"trial(s) {ok.number} met it but quantize no compute op" in result.verdict_reason
    saved = read_results(out)
    assert [t["status"] for t in saved["trials"]] == [t.status for t in result.trials]
    assert saved["best"] is None
    with sqlite3.connect(out / "run.db") as db:
        statuses = dict(db.execute("SELECT number, status FROM trials").fetchall())
    assert statuses == {t.number: t.status for t in result.trials}
    assert cnn_model.read_bytes() == model_bytes


def test_failures_are_not_cached(make_config, tmp_path):
    config = make_config(toy_flow(["fail"]))
    quantune.tune(config, output=tmp_path / "a")
    again = quantune.tune(config, output=tmp_path / "b")
    assert again.trials[0].status == "failed"
    assert "toy failure on purpose" in again.trials[0].error


def test_failed_passes_leave_no_scratch_folders(make_config, tmp_path):
    config = make_config(toy_flow(["fail", "nothing"]))
    quantune.tune(config, output=tmp_path / "out")
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


def assert_closest_miss_reported(result, out: Path) -> None:
    assert result.best is None
    assert result.best_model_path is None
    saved = read_results(out)
    assert saved["best"] is None
    miss = saved["closest_miss"]
    assert miss is not None and miss["meets_criterion"] is False
    evaluated = [t for t in saved["trials"] if t["status"] == "ok"]
    # the most accurate model faster than the original (engine/trials/selection.py miss_front), else of all
    faster = [t for t in evaluated if t["number"] in {row["number"] for row in saved["closest_miss_front"]}]
    assert miss["accuracy_loss"] == min(t["accuracy_loss"] for t in faster or evaluated)
    assert miss["number"] in {t["number"] for t in evaluated}
    assert (out / "closest_miss" / "model.onnx").is_file()
    assert not (out / "best").exists()
    params = json.loads((out / "closest_miss" / "params.json").read_text())
    assert params["meets_criterion"] is False
    assert params["params"] == miss["params"]
    onnx.checker.check_model(str(out / "closest_miss" / "model.onnx"))


def test_no_trial_meets_a_zero_absolute_budget(make_config, tmp_path, cnn_data):
    config = make_config(toy_flow(["negate", "roll"]), criterion={"type": "absolute", "tolerable_loss": 0.0})
    out = tmp_path / "out"
    result = quantune.tune(config, output=out)
    assert [t.status for t in result.trials] == ["ok", "ok"]
    assert all(t.meets_criterion is False and t.accuracy_loss > 0 for t in result.trials)
    assert_closest_miss_reported(result, out)
    # The saved model is the closest miss's: its top1 matches what was recorded.
    with np.load(cnn_data["evaluation"]) as archive:
        logits = run_model(out / "closest_miss" / "model.onnx", {"input": archive["input"]})[0]
        top1 = float(np.mean(np.argmax(logits, axis=1) == archive["label"]))
    assert top1 == pytest.approx(result.closest_miss.metrics["top1"])


def test_static_quant_cannot_meet_an_exact_output_criterion(make_config, tmp_path):
    passes = [{"name": "static_quant", "params": {"quant_format": {"search": ["QDQ", "QOperator"]}}}]
    config = make_config(
        passes,
        evaluation={"metric": "max_abs_diff", "latency": {"warmup": 1, "repeats": 3}},
        criterion={"type": "absolute", "tolerable_loss": 0.0},
    )
    out = tmp_path / "out"
    result = quantune.tune(config, output=out)
    assert result.baseline["max_abs_diff"] == 0.0
    assert all(t.status == "ok" and t.meets_criterion is False for t in result.trials)
    assert all(t.metrics["max_abs_diff"] > 0 for t in result.trials)
    assert result.criterion.higher_is_better is False
    assert_closest_miss_reported(result, out)


def test_stop_when_met_stops_at_the_first_success(make_config, tmp_path):
    config = make_config(toy_flow(["negate", "copy", "roll"]), stop={"max_trials": 10, "stop_when_met": True})
    result = quantune.tune(config, output=tmp_path / "out")
    assert [t.params[f"{TOY}.mode"] for t in result.trials] == ["negate", "copy"]
    assert result.trials[-1].meets_criterion


def test_timeout_zero_stops_at_the_first_success(make_config, tmp_path):
    """Neural Compressor's ``timeout: 0``: stop at the first model that meets the budget."""
    config = make_config(toy_flow(["negate", "roll", "copy"]), stop={"max_trials": 10, "timeout_s": 0})
    result = quantune.tune(config, output=tmp_path / "out")
    assert [t.params[f"{TOY}.mode"] for t in result.trials] == ["negate", "roll", "copy"]
    assert "timeout: 0" in result.stop_reason


def test_n_candidates_stops_after_that_many_successes(make_config, tmp_path):
    config = make_config(toy_flow(["copy", "negate", "roll"]), stop={"max_trials": 10, "n_candidates": 1})
    result = quantune.tune(config, output=tmp_path / "out")
    assert len(result.trials) == 1 and "n_candidates" in result.stop_reason


def test_wall_clock_timeout_stops_the_run(make_config, tmp_path):
    config = make_config(toy_flow(["negate", "copy", "roll"]), stop={"max_trials": 10, "timeout_s": 1e-9})
    result = quantune.tune(config, output=tmp_path / "out")
    assert result.trials == [] and "timeout" in result.stop_reason


def test_max_trials_limits_the_run(make_config, tmp_path):
    config = make_config(toy_flow(["negate", "copy", "roll"]), stop={"max_trials": 2})
    result = quantune.tune(config, output=tmp_path / "out")
    assert len(result.trials) == 2
    assert "max_trials" in result.stop_reason


def test_search_true_uses_the_pass_default_space(make_config, tmp_path):
    config = make_config([{"name": TOY, "search": True}])
    result = quantune.tune(config, output=tmp_path / "out")
    assert sorted(t.params[f"{TOY}.mode"] for t in result.trials) == ["copy", "negate"]


def test_a_trial_expected_to_end_after_the_timeout_is_not_started(make_config, tmp_path):
    import time

    from quantune.engine.run.deadline import TimeBudget
    from quantune.engine.run.loop import RunLoop
    from quantune.engine.trials.trial import TrialRecord
    from robust_helpers import built_loop

    stores = iter(range(100))

    def loop_at(elapsed_s: float, timeout_s: float | None, durations: dict[str, list[float]]) -> RunLoop:
        budget = TimeBudget(time.perf_counter() - elapsed_s)
        stop = {"timeout_s": timeout_s} if timeout_s is not None else {"max_trials": 8}
        loop = built_loop(make_config(stop=stop), tmp_path / f"run{next(stores)}.db", budget)
        loop.loop_started = budget.started  # the search began with the run: all of elapsed_s is the loop's
        loop.records.extend(
            TrialRecord(number=i, flow=[flow], params={}, status="ok", durations={"total_s": d})
            for flow, values in durations.items()
            for i, d in enumerate(values)
        )
        return loop

    slow_static = {"static": [40.0, 60.0], "dynamic": [10.0]}
    assert not loop_at(80, 100, slow_static)._would_overrun(("dynamic",))  # 80 + 10 fits
    late = loop_at(80, 100, slow_static)
    assert late._would_overrun(("static",))  # 80 + 50 does not
    assert "timeout (100 s)" in late._overrun_reason and "about 50 s" in late._overrun_reason
    assert loop_at(80, 100, slow_static)._would_overrun(("new_flow",))  # all trials' mean: 36.7
    assert not loop_at(50, 100, slow_static)._would_overrun(("new_flow",))
    assert not loop_at(99, 100, {})._would_overrun(("static",)), "nothing finished yet: no estimate"
    assert not loop_at(1e6, None, slow_static)._would_overrun(("static",))
    assert not loop_at(1e6, 0, slow_static)._would_overrun(("static",)), "timeout 0 means stop at first success"
    # the run's own work between trials (a strategy timing speed ceilings) counts per trial too:
    # 2 trials of 10 s in 60 s leave 40 s outside them, 20 s a trial, so the next takes about 30 s
    quick = {"static": [10.0, 10.0]}
    assert not loop_at(60, 100, quick)._would_overrun(("static",))  # 60 + 30 fits
    assert loop_at(75, 100, quick)._would_overrun(("static",))  # 75 + 10 + 27.5 does not


def test_a_one_off_stage_is_not_counted_as_every_trials_work(monkeypatch, make_config, tmp_path):
    """MiniLM at 60 s: a 12 s speed-ceiling stage made "the next trial" look 14 s long after a
    1.6 s trial, and the run stopped after one evaluation."""
    import time

    from quantune.engine.run import loop as loop_module
    from quantune.engine.run.deadline import TimeBudget
    from quantune.engine.trials.trial import TrialRecord
    from robust_helpers import built_loop

    spent = {"s": 100.0}
    monkeypatch.setattr(loop_module, "stage_seconds", lambda: spent["s"])  # the stages before the loop: 100 s
    budget = TimeBudget(time.perf_counter() - 34.0, end_reserve_s=8.0)
    loop = built_loop(make_config(stop={"timeout_s": 53.0}), tmp_path / "run.db", budget)
    loop.loop_started = time.perf_counter() - 14.0  # the search began 14 s ago
    loop.records.append(TrialRecord(number=0, flow=["dynamic"], params={}, status="ok", durations={"total_s": 1.6}))
    assert loop._would_overrun(("dynamic",))  # the stage's 12.4 s counted as per-trial work
    spent["s"] = 112.4  # ... but it was a stage
    assert not loop._would_overrun(("dynamic",))
