"""Honest verdicts: the original is always a candidate, and only a real win writes best/.

Also the figures the verdict rests on: paired ratios with their interval, ratios worded as
people read them, quantized-op counts from real onnxruntime quantization, and agreement
metrics that an empty or constant output cannot fool.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_dynamic, quantize_static

import quantune
from conftest import cnn_inputs, run_model
from quantune.evaluate import count_quantized, paired_ratio, quantization_figures
from quantune.evaluate.metrics import cosine, l2, max_abs_diff, top1_agreement
from quantune.report.console import summary
from quantune.report.result import format_ratio

SLOW = "test_slow_down"
WIDTH = 512  # the dead branch's width: ~8 MFLOP per batch of 16 against the CNN's ~0.1


class SlowDownConfig(quantune.PassConfig):
    width: int = WIDTH


@quantune.register_pass
class SlowDown(quantune.Pass):
    """Adds work that cannot change the outputs: a wide float MatMul branch from the input,
    multiplied by zero and added to the logits. Its model is slower than any model without
    it by construction (tens of times here), whatever the machine's speed."""

    name = SLOW
    Config = SlowDownConfig

    def run(self, config, model_in, model_out, context):
        model = onnx.load(str(model_in))
        graph = model.graph
        output = graph.output[0].name
        for node in graph.node:
            node.output[:] = [f"{name}_pre" if name == output else name for name in node.output]
        rng = np.random.default_rng(0)
        arrays = {
            "slow_shape": np.array([-1, 64], dtype=np.int64),
            "slow_w1": rng.normal(0, 0.1, (64, config.width)).astype(np.float32),
            "slow_w2": rng.normal(0, 0.1, (config.width, config.width)).astype(np.float32),
            "slow_zero": np.zeros((1,), dtype=np.float32),
        }
        graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in arrays.items())
        graph.node.extend(
            [
                helper.make_node("Reshape", [graph.input[0].name, "slow_shape"], ["slow_flat"], name="slow_reshape"),
                helper.make_node("MatMul", ["slow_flat", "slow_w1"], ["slow_h1"], name="slow_mm1"),
                helper.make_node("MatMul", ["slow_h1", "slow_w2"], ["slow_h2"], name="slow_mm2"),
                helper.make_node("ReduceSum", ["slow_h2"], ["slow_sum"], name="slow_sum", keepdims=1),
                helper.make_node("Mul", ["slow_sum", "slow_zero"], ["slow_dead"], name="slow_mul"),
                helper.make_node("Add", [f"{output}_pre", "slow_dead"], [output], name="slow_add"),
            ]
        )
        onnx.save(model, str(model_out))


def _results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


DYNAMIC = {"name": "dynamic_quant", "params": {"weight_type": "int8"}}
STATIC = {"name": "static_quant", "params": {"quant_format": "QDQ", "calibration_samples": 16}}
# QOperator stores the tiny CNN's weights in int8 without QDQ's extra nodes: a smaller file
STATIC_QOPERATOR = {"name": "static_quant", "params": {"quant_format": "QOperator", "calibration_samples": 16}}


# -- the three verdicts ------------------------------------------------------------------------


def test_a_slower_candidate_keeps_the_original_and_writes_no_best(make_config, tmp_path):
    config = make_config(
        passes=[DYNAMIC, {"name": SLOW}],
        evaluation={"metric": "top1", "latency": {"warmup": 1, "repeats": 7, "threads": 1, "confirm_top": 1}},
    )
    out = tmp_path / "out"
    result = quantune.tune(config, output=out)
    saved = _results(out)
    assert saved["verdict"] == result.verdict == "keep_original"
    assert "no candidate was faster" in saved["verdict_reason"]
    # best stays in results.json for information, but nothing is dressed up as a win
    assert saved["best"] is not None and saved["best"]["meets_criterion"] is True
    assert result.best_model_path is None
    assert not (out / "best").exists() and not (out / "closest_miss").exists()
    # the ratio's summary is kept, never the raw rounds
    ratio = saved["latency_confirmation"]["ratios"][str(saved["best"]["number"])]
    assert set(ratio) == {"ratio_median", "ratio_ci_low", "ratio_ci_high", "confidence", "rounds"}
    assert ratio["rounds"] == saved["latency_confirmation"]["rounds"] >= 5
    assert ratio["ratio_ci_low"] <= ratio["ratio_median"] <= ratio["ratio_ci_high"]
    text = summary(result)
    assert "keep the original: no candidate was faster (best candidate" in text
    assert "x slower side by side, trial" in text and "x faster" not in text
    assert saved["best"]["metrics"]["quantized_ops"] > 0


def test_a_smaller_candidate_is_improved_and_written_to_best(make_config, tmp_path):
    out = tmp_path / "out"
    result = quantune.tune(make_config(passes=[STATIC_QOPERATOR], objective="size"), output=out)
    saved = _results(out)
    assert saved["verdict"] == "improved"
    assert saved["best"]["metrics"]["size_bytes"] < saved["baseline"]["size_bytes"]
    assert "smaller than the original" in saved["verdict_reason"]
    assert result.best_model_path == out.resolve() / "best" / "model.onnx"
    assert result.best_model_path.is_file()
    assert json.loads((out / "best" / "params.json").read_text())["trial"] == saved["best"]["number"]
    assert summary(result).splitlines()[1].startswith("improved: trial")


def test_a_larger_candidate_keeps_the_original_on_size(make_config, tmp_path):
    # dynamic quantization of this tiny CNN adds more graph than it saves in weights
    out = tmp_path / "out"
    result = quantune.tune(make_config(passes=[DYNAMIC], objective="size"), output=out)
    best = result.best
    assert best is not None and best.metrics["size_bytes"] >= result.baseline["size_bytes"]
    assert result.verdict == "keep_original"
    assert "no candidate was smaller" in result.verdict_reason
    assert not (out / "best").exists()
    assert "x larger, trial" in summary(result)


def test_an_impossible_budget_has_no_candidate(make_config, tmp_path):
    # l2 of a quantized model to the original is never exactly 0
    config = make_config(
        passes=[STATIC], evaluation={"metric": "l2"}, criterion={"type": "absolute", "tolerable_loss": 0.0}
    )
    out = tmp_path / "out"
    result = quantune.tune(config, output=out)
    saved = _results(out)
    assert saved["verdict"] == "no_candidate_in_budget"
    assert saved["best"] is None and result.best_model_path is None
    assert saved["verdict_reason"].startswith("no trial met the criterion")
    assert (out / "closest_miss" / "model.onnx").is_file() and not (out / "best").exists()


def test_a_model_quantizing_nothing_is_no_candidate(make_config, tmp_path):
    # (nodes_to_exclude: [conv1, conv2, fc] would not do: onnxruntime renames the Gemm to fc_MatMul first)
    everything = {"name": "dynamic_quant", "params": {"op_types_to_quantize": ["LSTM"]}}
    out = tmp_path / "out"
    result = quantune.tune(make_config(passes=[everything], objective="size"), output=out)
    (trial,) = result.trials
    assert trial.meets_criterion is True  # the same outputs: it meets any budget...
    assert trial.metrics["quantized_ops"] == 0 and trial.metrics["quantized_compute_fraction"] == 0.0
    assert result.verdict == "no_candidate_in_budget"  # ...but it is the original in disguise
    assert result.best is None and result.closest_miss is None
    assert "quantize no compute op" in result.verdict_reason
    assert not (out / "best").exists() and not (out / "closest_miss").exists()


def test_every_trial_and_the_baseline_record_what_was_quantized(make_config, tmp_path):
    passes = [{"name": "dynamic_quant", "params": {"nodes_to_exclude": {"search": [[], ["conv2"]]}}}]
    result = quantune.tune(make_config(passes=passes), output=tmp_path / "out")
    assert result.baseline["quantized_ops"] == 0 and result.baseline["quantized_compute_fraction"] == 0.0
    by_excluded = {tuple(t.params["dynamic_quant.nodes_to_exclude"]): t.metrics for t in result.trials}
    assert by_excluded[()]["quantized_ops"] == by_excluded[("conv2",)]["quantized_ops"] + 1
    assert by_excluded[()]["quantized_compute_fraction"] == 1.0
    assert 0 < by_excluded[("conv2",)]["quantized_compute_fraction"] < 1


# -- paired ratios and their wording -----------------------------------------------------------


def test_paired_ratio_interval_is_the_sign_test_bound():
    original = np.full(5, 2.0)
    faster = paired_ratio(np.array([1.0, 1.2, 0.9, 1.1, 1.5]), original)  # every round faster
    assert faster.faster and faster.high == pytest.approx(0.75) and faster.low == pytest.approx(0.45)
    assert faster.median == pytest.approx(0.55)
    one_round_slower = paired_ratio(np.array([1.0, 1.2, 0.9, 1.1, 2.5]), original)
    assert not one_round_slower.faster  # 5 rounds prove a speed-up only when all agree
    too_few = paired_ratio(np.array([1.0, 1.0, 1.0]), np.full(3, 2.0))
    assert not too_few.faster and math.isinf(too_few.high)
    assert too_few.to_dict()["ratio_ci_high"] is None
    # with many rounds, the upper end is the u-th smallest ratio, u the smallest rank whose
    # binomial tail P(B >= u) is at most 5%
    rounds = 50
    ratios = np.linspace(0.5, 1.5, rounds)
    interval = paired_ratio(ratios, np.ones(rounds))
    rank = int(np.searchsorted(ratios, interval.high)) + 1
    tail = sum(math.comb(rounds, k) for k in range(rank, rounds + 1)) / 2**rounds
    wider = sum(math.comb(rounds, k) for k in range(rank - 1, rounds + 1)) / 2**rounds
    assert tail <= 0.05 < wider
    assert interval.low == pytest.approx(ratios[rounds - rank])


def test_ratios_are_worded_as_people_read_them():
    assert format_ratio(1.5, 1.0) == "1.50x slower"
    assert format_ratio(1.0, 2.1) == "2.10x faster"
    assert format_ratio(5.937, 3.918) == "1.52x slower"  # the "0.66x faster"
    assert format_ratio(100, 370, less="smaller", more="larger") == "3.70x smaller"
    assert format_ratio(1.08, 1.0, less="smaller", more="larger") == "1.08x larger"
    assert format_ratio(1.001, 1.0) == "the same (1.00x)"
    assert format_ratio(0.0, 1.0) == "no ratio"


def test_no_report_prints_a_factor_below_one_as_faster():
    root = Path(quantune.__file__).parent
    for path in (root / "report" / "console.py", root / "report" / "html.py"):
        text = path.read_text()
        assert "x faster" not in text and "x smaller" not in text, f"{path.name} words a ratio itself"


# -- quantized-op counts from real onnxruntime quantization --------------------------------------


class _Reader(CalibrationDataReader):
    def __init__(self) -> None:
        self._batches = iter([{"input": cnn_inputs(8, seed=3)}])

    def get_next(self):
        return next(self._batches, None)


@pytest.mark.parametrize(
    ("form", "quantized_types"),
    [
        ("QDQ", {"DequantizeLinear"}),
        ("QOperator", {"QLinearConv"}),
        ("dynamic", {"ConvInteger", "MatMulInteger"}),
    ],
)
def test_quantized_ops_are_counted_in_every_form(cnn_model, tmp_path, form, quantized_types):
    def quantize(target: Path, exclude: list[str]) -> Path:
        if form == "dynamic":
            quantize_dynamic(str(cnn_model), str(target), nodes_to_exclude=exclude)
        else:
            quant_format = QuantFormat.QDQ if form == "QDQ" else QuantFormat.QOperator
            quantize_static(str(cnn_model), str(target), _Reader(), quant_format=quant_format, nodes_to_exclude=exclude)
        return target

    original = onnx.load(str(cnn_model))
    compute = sum(node.op_type in {"Conv", "Gemm", "MatMul"} for node in original.graph.node)
    assert count_quantized(original) == (0, compute)

    full = quantize(tmp_path / "full.onnx", [])
    types = {node.op_type for node in onnx.load(str(full)).graph.node}
    assert quantized_types <= types  # the form really is the one under test
    assert quantization_figures(full) == {"quantized_ops": compute, "quantized_compute_fraction": 1.0, "float16_ops": 0}

    partial = quantize(tmp_path / "partial.onnx", ["conv2"])
    figures = quantization_figures(partial)
    assert figures["quantized_ops"] == compute - 1
    assert figures["quantized_compute_fraction"] == pytest.approx((compute - 1) / compute)
    x = cnn_inputs(4, seed=5)
    assert run_model(partial, {"input": x})[0].shape == run_model(cnn_model, {"input": x})[0].shape


def test_a_weight_only_dequantize_does_not_count(tmp_path):
    """A MatMul whose weight is dequantized but whose input is float computes in float."""
    weight = np.arange(12, dtype=np.int8).reshape(3, 4)
    graph = helper.make_graph(
        [
            helper.make_node("DequantizeLinear", ["wq", "scale", "zero"], ["w"], name="dq"),
            helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
        ],
        "weight_only",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [
            numpy_helper.from_array(weight, "wq"),
            numpy_helper.from_array(np.array(0.1, dtype=np.float32), "scale"),
            numpy_helper.from_array(np.array(0, dtype=np.int8), "zero"),
        ],
    )
    assert count_quantized(helper.make_model(graph)) == (0, 1)


# -- agreement metrics that an empty output cannot fool -----------------------------------------


def test_cosine_scores_zero_and_constant_outputs_honestly():
    rng = np.random.default_rng(0)
    reference = rng.uniform(0.1, 1.0, (6, 3, 4)).astype(np.float32)  # all positive, like a probability map
    assert cosine(reference, reference) == pytest.approx(1.0)
    assert cosine(np.zeros_like(reference), reference) == 0.0  # found nothing: not perfect
    assert cosine(np.zeros_like(reference), np.zeros_like(reference)) == 1.0
    constant = np.full_like(reference, reference.mean())
    assert abs(cosine(constant, reference)) < 1e-9  # raw cosine would score it ~0.9
    raw = np.sum(constant * reference) / (np.linalg.norm(constant) * np.linalg.norm(reference))
    assert raw > 0.85
    assert cosine(reference + 1.0, reference) < 0.9  # an offset is not agreement
    near = reference + rng.normal(0, 1e-3, reference.shape).astype(np.float32)
    assert cosine(near, reference) > 0.999  # quantization noise still scores near 1
    broken = reference.copy()
    broken[0, 0, 0] = np.nan
    assert cosine(broken, reference) == pytest.approx(5 / 6)
    # a constant reference sample falls back to the raw cosine, zero cases still right
    flat_ref = np.ones((2, 4), dtype=np.float32)
    assert cosine(flat_ref * 3, flat_ref) == pytest.approx(1.0)
    assert cosine(np.zeros_like(flat_ref), flat_ref) == 0.0


def test_top1_agreement_and_distances_are_not_fooled():
    reference = np.array([[3.0, 1.0, 0.0], [2.0, 0.5, 0.1], [0.0, 4.0, 1.0]])
    zeros = np.zeros_like(reference)
    assert top1_agreement(reference, reference) == 1.0
    # argmax of an all-zero row is 0, which would "agree" with the first two rows
    assert top1_agreement(zeros, reference) == 0.0
    assert top1_agreement(zeros, zeros) == 1.0
    nan = reference.copy()
    nan[0, 0] = np.nan
    assert top1_agreement(nan, reference) == pytest.approx(2 / 3)
    assert l2(nan, reference) == math.inf and max_abs_diff(nan, reference) == math.inf
    assert l2(zeros, reference) > 0 and max_abs_diff(zeros, reference) == 4.0


def test_a_strategy_that_measured_every_variant_slower_keeps_the_original_without_trials():
    from quantune.engine.outcome.verdict import decide

    settled = decide([], ["latency"], {"latency_ms": 1.0}, original_wins="every quantized variant was slower")
    assert settled.kind == "keep_original" and settled.best is None
    assert "every quantized variant was slower" in settled.reason
    assert decide([], ["latency"], {"latency_ms": 1.0}).kind == "no_candidate_in_budget"  # nothing measured


def test_a_gain_under_two_percent_is_not_faster() -> None:
    """LAC tagger: an interval of 0.890-0.994 in the run re-timed 1.03x slower minutes later."""
    from quantune.evaluate.paired import MIN_GAIN, paired_ratio

    original = np.full(50, 1.0)
    slight = paired_ratio(np.full(50, 0.99), original)
    assert slight.high < 1.0 and not slight.faster
    clear = paired_ratio(np.full(50, 1.0 - 2 * MIN_GAIN), original)
    assert clear.faster
