"""Start-up and evaluation costs cut without changing a figure (issue 10's time to the first model)."""

from __future__ import annotations

import numpy as np
import pytest

from quantune.evaluate import metrics


def _cases() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(3)
    cases = []
    for shape in [(9, 5), (30, 1, 17), (6, 3, 4, 7)]:
        ref = rng.normal(size=shape).astype(np.float32)
        out = (ref + rng.normal(scale=0.2, size=shape)).astype(np.float32)
        broken = out.copy()
        broken[0] = 0.0  # an all-zero row
        broken[-1] = np.inf  # a non-finite row
        broken[len(broken) // 2] = 2.5  # a constant row
        ints = np.rint(out * 3).astype(np.int64), np.rint(ref * 3).astype(np.int64)
        cases += [(out, ref), (broken, ref), (out.astype(np.float64), ref), ints, (ref, ref)]
    return cases


@pytest.mark.parametrize("name", sorted(metrics.AGREEMENT_METRICS))
def test_agreement_metrics_in_blocks_give_the_same_figures(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agreement metrics run over row blocks (no float64 copy of a whole large output): a
    block of one row, of a few rows and one block for everything give bit-identical figures."""
    func = metrics.AGREEMENT_METRICS[name]
    for out, ref in _cases():
        figures = []
        for block in (1, 7, 1 << 30):
            monkeypatch.setattr(metrics, "BLOCK_ELEMENTS", block)
            figures.append(func(out, ref))
        assert figures[0] == figures[1] == figures[2], (name, out.shape, out.dtype, figures)
    monkeypatch.setattr(metrics, "BLOCK_ELEMENTS", 7)
    ref = np.random.default_rng(0).normal(size=(20, 6)).astype(np.float32)
    perfect = {"top1_agreement": 1.0, "cosine": 1.0, "l2": 0.0, "max_abs_diff": 0.0}
    assert func(ref, ref) == pytest.approx(perfect[name])
    broken = ref.copy()
    broken[3, 2] = np.nan  # one broken row among 20, in the second block
    worst = {"top1_agreement": 19 / 20, "cosine": 19 / 20, "l2": float("inf"), "max_abs_diff": float("inf")}
    assert func(broken, ref) == pytest.approx(worst[name])


def test_preparation_checks_the_result_once_when_every_step_keeps_the_outputs(tmp_path, monkeypatch) -> None:
    """Every default step changes this exporter-style model; the prepared model is checked once
    (not once per step), and is the same model (same steps, same outputs) a step-by-step check keeps."""
    from quantune.model import ModelHandle
    from quantune.prepare import PrepareOptions, pipeline, prepare_model
    from quantune.prepare.check import outputs_differ, run_feeds
    from quantune.store import ArtifactCache
    from test_prepare import FEEDS, build_variant

    model = build_variant(tmp_path / "m.onnx", opset=12, constant_weights=True, batch_norm=True, computed_bias=True)
    runs = []
    real = pipeline.run_feeds
    monkeypatch.setattr(pipeline, "run_feeds", lambda path, feeds: runs.append(path) or real(path, feeds))
    fast = prepare_model(ModelHandle.from_path(model), FEEDS, ArtifactCache(tmp_path / "c1"), PrepareOptions(13))
    assert len(fast.steps) >= 3 and fast.warnings == []
    assert len(runs) == 2  # the original's reference outputs, then the prepared model's
    assert outputs_differ(run_feeds(model, FEEDS), run_feeds(fast.model, FEEDS)) is None
    # the step-by-step path (taken when the result differs) keeps the same steps and model
    monkeypatch.setattr(pipeline, "_all_steps", lambda *args: None)
    slow = prepare_model(ModelHandle.from_path(model), FEEDS, ArtifactCache(tmp_path / "c2"), PrepareOptions(13))
    assert slow.steps == fast.steps and slow.sha256 == fast.sha256
    assert len(runs) - 2 > 2  # its reference, then one check per step that changed something


def test_a_prepared_model_far_below_the_size_limit_is_saved_whole(tmp_path) -> None:
    import onnx

    from quantune.prepare._files import save_model
    from test_prepare import build_variant

    model = onnx.load(str(build_variant(tmp_path / "m.onnx")))
    save_model(model, tmp_path / "out" / "model.onnx")
    assert onnx.load(str(tmp_path / "out" / "model.onnx")) == model
    assert not (tmp_path / "out" / "model.onnx.data").exists()


def test_shape_inference_for_capture_sizes_needs_no_weights(tmp_path) -> None:
    """The sensitivity's capture plan sizes tensors by shape inference on a copy without the large
    float weights' values: the same sizes as on the whole model (a Reshape's shape constant kept)."""
    from onnx import TensorProto, helper, numpy_helper

    from quantune.evaluate.sensitivity.capture import tensor_bytes, without_weights

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(size=(64, 96)).astype(np.float32), "w")
    target = numpy_helper.from_array(np.array([0, -1, 8], dtype=np.int64), "shape")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
            helper.make_node("Reshape", ["m", "shape"], ["r"], name="reshape"),
            helper.make_node("Relu", ["r"], ["y"], name="relu"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight, target],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    light = without_weights(model)
    assert not light.graph.initializer[0].raw_data and light.graph.initializer[1].raw_data  # weights gone, shape kept
    assert model.graph.initializer[0].raw_data  # the model itself is untouched
    for shapes in ({"x": (1, 5, 64)}, {"x": (2, 7, 64)}):
        full = tensor_bytes(model, shapes)
        assert full["r"] == shapes["x"][0] * shapes["x"][1] * 96 * 4  # the Reshape's output was inferred
        assert tensor_bytes(light, shapes) == full


@pytest.mark.parametrize("name", sorted(metrics.AGREEMENT_METRICS))
def test_the_originals_own_figures_are_what_each_metric_gives_identical_outputs(name: str) -> None:
    """The original is not compared with itself (its figures are ``IDENTICAL``): every agreement
    metric gives those figures for any finite outputs against themselves, constant and zero rows too."""
    from quantune.evaluate.evaluator import IDENTICAL

    assert set(IDENTICAL) == set(metrics.AGREEMENT_METRICS)
    for out, _ in _cases():
        if np.all(np.isfinite(out.astype(np.float64))):
            assert metrics.AGREEMENT_METRICS[name](out, out) == pytest.approx(IDENTICAL[name], abs=1e-6)
    zeros = np.zeros((4, 5), dtype=np.float32)
    constant = np.full((4, 5), 2.5, dtype=np.float32)
    for out in (zeros, constant):
        assert metrics.AGREEMENT_METRICS[name](out, out) == pytest.approx(IDENTICAL[name])


def test_the_originals_reference_is_cached_before_it_is_timed(make_config, monkeypatch) -> None:
    """A first guess evaluated beside the original compares with the reference while the original
    is still timed: the outputs reach the cache before the timing starts, the figures after it,
    and the reference read then is the one the run keeps."""
    from quantune.config import load_config
    from quantune.engine.measure.baseline import cached_figures, cached_reference
    from quantune.engine.trials.runner import TrialRunner
    from quantune.engine.trials.setup import build_run

    runner = TrialRunner(build_run(load_config(make_config())).context)
    backend = runner.context.evaluator.backend
    seen: list[tuple[bool, bool]] = []
    real = backend.time

    def timings(request):  # the real timing, noting what the cache held when it began
        if request.threshold is None:  # side by side
            seen.append((cached_reference(runner) is not None, cached_figures(runner) is not None))
        return real(request)

    monkeypatch.setattr(backend, "time", timings)
    assert cached_reference(runner) is None
    runner.baseline()
    assert seen == [(True, False)]
    early = cached_reference(runner)
    assert early is not None and early.keys() == runner.reference().keys()
    assert all(np.array_equal(early[name], runner.reference()[name]) for name in early)
    assert cached_figures(runner) is not None


def test_a_quick_timing_of_the_original_is_marked_and_timed_again(make_config, monkeypatch) -> None:
    """Beside the first guess the original is timed in a few rounds; its cached figures say so
    until the engine times it again in full (``retime_original``), under the same cache key."""
    from quantune.config import load_config
    from quantune.engine.measure.baseline import retime_original, timed_quickly
    from quantune.engine.trials.runner import TrialRunner
    from quantune.engine.trials.setup import build_run
    from quantune.evaluate.evaluator import QUICK_REPEATS

    config = make_config(evaluation={"metric": "top1", "latency": {"warmup": 2, "repeats": 40, "threads": 1}})
    context = build_run(load_config(config)).context
    rounds: list[int] = []
    real = context.evaluator.backend.time
    monkeypatch.setattr(
        context.evaluator.backend,
        "time",
        lambda request: (request.threshold is None and rounds.append(request.spec.repeats)) or real(request),
    )
    key = context.eval_key(context.model.sha256)
    figures, status = TrialRunner(context).baseline(quick_timing=True)
    assert status == "miss" and rounds == [QUICK_REPEATS] and timed_quickly(context)
    assert not context.evaluator.quick_timing  # only for that evaluation
    fresh = retime_original(context)
    assert rounds[-1] == 40 and not timed_quickly(context)
    cached = context.cache.get_json("evals", key)["metrics"]
    assert cached["latency_ms"] == fresh["latency_ms"] and cached["top1"] == figures["top1"]


def test_the_originals_evaluation_time_is_kept_for_the_first_trials_estimate(make_config) -> None:
    """The first trial of a limited run is not started when even it would end inside the end's
    reserve: before any trial, it is expected to take what the original's evaluation took
    (issue 23), which the cache keeps beside the figures, through a re-timing too."""
    from quantune.config import load_config
    from quantune.engine.measure.baseline import evaluation_seconds, retime_original
    from quantune.engine.trials.runner import TrialRunner
    from quantune.engine.trials.setup import build_run

    context = build_run(load_config(make_config())).context
    assert evaluation_seconds(context) == 0.0  # nothing evaluated: no estimate
    TrialRunner(context).baseline(quick_timing=True)
    seconds = evaluation_seconds(context)
    assert seconds > 0.0
    retime_original(context)
    assert evaluation_seconds(context) == seconds
