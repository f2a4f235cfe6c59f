"""session_tuning: settings chosen by side-by-side timing travel with the candidate (a sidecar file)
and every session that measures it -- accuracy and latency -- runs with them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import quantune
from conftest import cnn_inputs
from quantune.data import load_dataset
from quantune.errors import QuantuneError, TrialError
from quantune.evaluate import EvaluationSpec, Evaluator, LatencySpec
from quantune.evaluate.latency import TimingRequest, time_side_by_side
from quantune.evaluate.session_file import read_session_settings, session_file, write_session_settings
from quantune.passes import PassContext
from quantune.passes.onnx.session_tuning import SessionTuning, SessionTuningConfig, thread_options
from quantune.passes.timing import PassTiming

DIGITS = Path(__file__).resolve().parents[1] / "examples" / "digits"
SEEN: list[ort.SessionOptions] = []
SESSIONS: list[ort.InferenceSession] = []  # held, so no two sessions share an id


def recording_runner(session: ort.InferenceSession, feeds: list[dict]) -> list[dict]:
    """A runner that notes the options of the session it is handed (the observable)."""
    SEEN.append(session.get_session_options())
    if not any(seen is session for seen in SESSIONS):
        SESSIONS.append(session)
    return [dict(zip([o.name for o in session.get_outputs()], session.run(None, feed), strict=True)) for feed in feeds]


def _evaluator(tmp_path: Path) -> Evaluator:
    np.savez(tmp_path / "eval.npz", input=cnn_inputs(16, seed=3))
    spec = EvaluationSpec(
        metric="cosine",
        batch_size=8,
        latency=LatencySpec(warmup=1, repeats=3, threads=1),
        runner=recording_runner,
        runner_name="recording_runner",
    )
    return Evaluator(spec, load_dataset("eval.npz", field_name="data.evaluation", base_dir=tmp_path), ["input"])


def test_the_sidecar_settings_reach_the_accuracy_and_the_latency_sessions(cnn_model, tmp_path):
    candidate = tmp_path / "candidate" / "model.onnx"
    candidate.parent.mkdir()
    shutil.copyfile(cnn_model, candidate)
    write_session_settings(
        candidate, {"graph_optimization_level": "basic", "enable_mem_pattern": False, "enable_cpu_mem_arena": False}
    )
    evaluator = _evaluator(tmp_path)
    SEEN.clear()
    SESSIONS.clear()
    evaluator.evaluate(candidate, None)
    assert len(SESSIONS) == 2  # the accuracy session and the timing session
    assert len(SEEN) == 1 + 1 + 3  # one accuracy call, one warm-up, three timed runs
    for options in SEEN:
        assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        assert not options.enable_mem_pattern
        assert not options.enable_cpu_mem_arena
    SEEN.clear()
    evaluator.evaluate(cnn_model, None)  # no sidecar: onnxruntime's defaults
    assert all(o.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL for o in SEEN)
    assert all(o.enable_mem_pattern for o in SEEN)


def test_side_by_side_times_each_row_with_its_own_settings(cnn_model):
    SEEN.clear()
    levels = [{"graph_optimization_level": "disable_all"}, {"graph_optimization_level": "extended"}]
    spec = LatencySpec(warmup=0, repeats=2, threads=1)
    timings = time_side_by_side(
        [cnn_model, cnn_model], {"input": cnn_inputs(4, 0)}, spec, runner=recording_runner, settings=levels
    )
    assert timings.shape == (2, 2)
    assert SEEN[0].graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert SEEN[1].graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED


def _timing(threads: int) -> PassTiming:
    return PassTiming({"input": cnn_inputs(8, 0)}, LatencySpec(warmup=1, repeats=5, threads=threads))


def _run(config: SessionTuningConfig, model: Path, tmp_path: Path, threads: int = 1) -> dict:
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir(exist_ok=True)
    context = PassContext(None, ["input"], 8, tmp_path, timing=_timing(threads))
    SessionTuning().run(config, model, out, context)
    assert out.read_bytes() == model.read_bytes()  # the model itself is unchanged
    return read_session_settings(out)


def test_the_pass_writes_every_setting_within_the_thread_budget(cnn_model, tmp_path):
    settings = _run(SessionTuningConfig(rounds=5), cnn_model, tmp_path, threads=2)
    assert set(settings) == {
        "execution_mode",
        "intra_op_num_threads",
        "inter_op_num_threads",
        "graph_optimization_level",
        "enable_mem_pattern",
        "enable_cpu_mem_arena",
    }
    assert settings["intra_op_num_threads"] + settings["inter_op_num_threads"] - 1 <= 2
    quantune.evaluate.open_session(cnn_model, threads=1, settings=settings)  # loads as stored


def test_fixed_parameters_are_kept_and_a_budget_overrun_is_refused(cnn_model, tmp_path):
    fixed = SessionTuningConfig(graph_optimization_level="basic", enable_mem_pattern=False, rounds=5)
    settings = _run(fixed, cnn_model, tmp_path)
    assert settings["graph_optimization_level"] == "basic"
    assert settings["enable_mem_pattern"] is False
    with pytest.raises(TrialError, match=r"intra_op_num_threads: 4 exceeds .*evaluation.latency.threads \(1\)"):
        _run(SessionTuningConfig(intra_op_num_threads=4), cnn_model, tmp_path)


def test_thread_options_stay_within_the_budget():
    for budget in (1, 2, 3, 4, 8):
        for option in thread_options(budget, SessionTuningConfig()):
            assert option["intra_op_num_threads"] + option["inter_op_num_threads"] - 1 <= budget
    assert {o["execution_mode"] for o in thread_options(1, SessionTuningConfig())} == {"sequential"}
    assert any(o["execution_mode"] == "parallel" for o in thread_options(2, SessionTuningConfig()))


def test_a_tuned_candidate_carries_its_settings_to_results_and_best(make_config, tmp_path):
    """objective size on the digits CNN: its int8 model is smaller, exactly, so the verdict is
    improved and best/ is written."""
    config = make_config(
        model=str(DIGITS / "model.onnx"),
        data={"calibration": str(DIGITS / "calib.npz"), "evaluation": str(DIGITS / "eval.npz"), "batch_size": 64},
        criterion={"type": "relative", "tolerable_loss": 0.05},
        passes=[
            {"name": "dynamic_quant", "params": {"weight_type": "int8"}},
            {
                "name": "session_tuning",
                "params": {"rounds": 5, "graph_optimization_level": {"search": ["basic", "all"]}},
            },
        ],
        objective="size",
    )
    result = quantune.tune(config, output=tmp_path / "run")
    assert [t.status for t in result.trials] == ["ok", "ok"]
    levels = {t.session_settings["graph_optimization_level"] for t in result.trials}
    assert levels == {"basic", "all"}
    # other settings, another candidate: the two were evaluated separately, not one reused
    assert len({t.model_sha256 for t in result.trials}) == 2
    assert all(t.cache["evaluation"] == "miss" for t in result.trials)
    assert result.verdict == "improved"
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["best"]["session_settings"] == result.best.session_settings
    best = tmp_path / "run" / "best" / "model.onnx"
    assert read_session_settings(best) == result.best.session_settings
    assert json.loads((best.parent / "params.json").read_text())["session_settings"] == result.best.session_settings
    assert session_file(best).name == "model.onnx.session.json"


def test_session_tuning_must_end_its_flows(make_config, tmp_path):
    config = make_config(passes=[{"name": "session_tuning"}, {"name": "dynamic_quant"}])
    with pytest.raises(QuantuneError, match=r"flows: 'session_tuning' \(session_tuning\) must be the last step"):
        quantune.tune(config, output=tmp_path / "run")


def _fake_timer(requests: list[TimingRequest]):
    """Timings that follow each model copy's own settings (its sidecar): the basic graph level
    takes 0.8 of the time, the memory pattern off 0.9, anything else 1.0; each round's load
    scales every row alike, so the ratios are paired."""

    def time_request(request: TimingRequest) -> np.ndarray:
        requests.append(request)
        factors = []
        for model in request.models:
            settings = read_session_settings(model) or {}
            factor = 0.8 if settings.get("graph_optimization_level") == "basic" else 1.0
            factors.append(factor * (0.9 if settings.get("enable_mem_pattern") is False else 1.0))
        load = 1.0 + np.random.default_rng(0).random(request.spec.repeats)
        return np.outer(factors, load) * 1e-3

    return time_request


def test_the_pass_and_the_post_verdict_search_choose_through_one_routine(cnn_model, tmp_path, monkeypatch):
    """Both search session settings with ``search_groups``, asking for timings as a
    ``TimingRequest`` (so a target can time them) and keeping a value only when it is faster
    side by side: from the same timings they choose the same graph level."""
    from types import SimpleNamespace

    from quantune.engine.measure.session_search import search_session
    from quantune.passes.onnx import session_tuning

    requests: list[TimingRequest] = []
    monkeypatch.setattr(session_tuning, "time_here", _fake_timer(requests))
    settings = _run(SessionTuningConfig(rounds=5), cnn_model, tmp_path)
    assert settings["graph_optimization_level"] == "basic" and settings["enable_mem_pattern"] is False
    assert settings["enable_cpu_mem_arena"] is True  # no faster value: the default stays
    assert all(r.spec.repeats == 5 and len(r.models) > 1 for r in requests)
    passed = len(requests)
    spec = SimpleNamespace(latency=LatencySpec(warmup=1, repeats=5, threads=1), runner=None)
    evaluator = SimpleNamespace(
        spec=spec, latency_feed={"input": cnn_inputs(8, 0)}, backend=SimpleNamespace(time=_fake_timer(requests))
    )
    found = search_session(evaluator, cnn_model, {}, "CPUExecutionProvider")
    assert found["settings"] == {"graph_optimization_level": "basic"}  # the execution mode: not faster
    assert [entry["chosen"] for entry in found["tried"]] == [{"graph_optimization_level": "basic"}, {}]
    assert len(requests) > passed  # timed through the backend's Backend.time
