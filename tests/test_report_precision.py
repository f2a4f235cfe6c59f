"""The precision map: each compute op's precision read from a model onnxruntime quantized, and
each fallback's reason from the trial records."""

from __future__ import annotations

from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

from conftest import build_cnn, build_mlp, cnn_inputs
from quantune.engine.outcome.result import Result
from quantune.engine.trials.trial import TrialRecord
from quantune.report.precision import evidence, excluded, fallbacks, op_precisions, precision_counts


class _Reader(CalibrationDataReader):
    def __init__(self) -> None:
        self.rows = iter([{"input": cnn_inputs(4, seed=i)} for i in range(4)])

    def get_next(self):
        return next(self.rows, None)


def _static(tmp_path, fmt, activation, exclude=()):
    source = build_cnn(tmp_path / "cnn.onnx")
    target = tmp_path / f"q-{fmt.name}-{activation.name}.onnx"
    quantize_static(
        str(source),
        str(target),
        _Reader(),
        quant_format=fmt,
        activation_type=activation,
        weight_type=QuantType.QInt8,
        nodes_to_exclude=list(exclude),
    )
    return target


def test_qdq_ops_read_their_types_and_an_excluded_conv_is_fp32(tmp_path):
    ops = {op.name: op for op in op_precisions(_static(tmp_path, QuantFormat.QDQ, QuantType.QUInt8, ["conv2"]))}
    assert set(ops) == {"conv1", "conv2", "fc"}
    assert ops["conv1"].precision == "uint8" and "weights int8" in ops["conv1"].detail
    assert ops["conv2"].precision == "fp32"
    assert precision_counts(ops.values()) == {"Conv": {"uint8": 1, "fp32": 1}, "Gemm": {ops["fc"].precision: 1}}


def test_int16_activations_and_qoperator_kernels(tmp_path):
    qdq16 = {op.name: op.precision for op in op_precisions(_static(tmp_path, QuantFormat.QDQ, QuantType.QInt16))}
    assert qdq16["conv1"] == "int16" and qdq16["conv2"] == "int16"
    qop = op_precisions(_static(tmp_path, QuantFormat.QOperator, QuantType.QInt8))
    convs = [op for op in qop if op.op_type == "QLinearConv"]
    assert len(convs) == 2 and {op.precision for op in convs} == {"int8"}
    assert {op.original for op in convs} == {"conv1", "conv2"}  # QOperator renames nodes ..._quant


def test_dynamic_quantization_is_int8_with_dynamic_activations(tmp_path):
    source = build_mlp(tmp_path / "mlp.onnx")
    target = tmp_path / "dyn.onnx"
    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8)
    ops = op_precisions(target)
    matmul = next(op for op in ops if op.op_type == "MatMulInteger")
    assert matmul.precision == "int8" and "activations uint8" in matmul.detail and "dynamic" in matmul.detail
    assert [op.original for op in ops] == ["matmul1", "fc_MatMul"]  # the Gemm became MatMul + Add, quantized too


def _typed(results):
    """A results.json as the report reads it (Result.from_json), the keys a test does not set filled in."""
    base = {"trials": [], "baseline": {}, "metric": "top1", "criterion": {"type": "absolute", "tolerable_loss": 0.01}}
    return Result.from_json({**base, **results}, ".")


def _trial(number, excluded, meets, stage, loss):
    return {
        "number": number,
        "flow": ["static_quant"],
        "params": {"static_quant.per_channel": False, "static_quant.nodes_to_exclude": excluded},
        "status": "ok",
        "meets_criterion": meets,
        "accuracy_loss": loss,
        "stage": stage,
        "metrics": {"latency_ms": 1.0},
    }


def test_each_fallback_names_its_sensitivity_and_the_trial_that_showed_it_was_needed():
    chosen = _trial(5, ["a", "b"], True, "prune: c -> int8", 0.004)
    trials = [
        _trial(0, [], False, "ceiling: static_quant: QDQ/uint8", 0.09),
        _trial(1, ["a"], False, "bisect: k=1/3 [a]", 0.02),
        _trial(2, ["a", "b", "c"], True, "bisect: k=3/3 [a, b, c]", 0.001),
        _trial(3, ["b", "c"], False, "prune: a -> int8", 0.015),
        chosen,
        {"number": 6, "flow": ["static_quant"], "params": {}, "status": "failed", "stage": "latency"},
    ]
    results = {
        "trials": trials,
        "best": chosen,
        "strategy": {
            "sensitivity": {
                "static_quant": {
                    "a": {"score": 0.5, "op_type": "Conv", "nodes": ["a"]},
                    "b": {"score": 0.2, "op_type": "Conv", "nodes": ["b"]},
                    "c": {"score": 0.1, "op_type": "Gemm", "nodes": ["c"]},
                }
            }
        },
    }
    typed, record = _typed(results), TrialRecord.from_dict(chosen)
    found = {f.node: f for f in fallbacks(typed, record)}
    assert set(found) == {"a", "b"}
    assert (found["a"].score, found["a"].rank, found["a"].groups_ranked) == (0.5, 1, 3)
    assert found["a"].evidence["number"] == 3  # prune: a -> int8 missed, the rest held as chosen
    assert found["b"].evidence["number"] == 1  # the closest trial that quantized b and missed
    assert found["b"].evidence["other_differences"] == 0
    assert evidence(typed, record, "z") is not None  # any node: the fully quantized ceiling at worst
    assert evidence(_typed({"trials": [chosen]}), record, "a") is None  # nothing ever quantized it and missed


def test_a_quantune_strategy_run_records_sensitivity_and_the_report_gives_each_fallback_its_reason(
    make_config, tmp_path, monkeypatch
):
    import json

    import quantune

    monkeypatch.setenv("QUANTUNE_REPORT", "1")
    config = make_config(
        passes=[{"name": "static_quant", "search": True}],
        criterion={"type": "absolute", "tolerable_loss": 0.0, "higher_is_better": True},
        evaluation={"metric": "cosine", "latency": {"warmup": 0, "repeats": 2}},
        search={"strategy": "quantune", "seed": 0, "strategy_options": {"drop_slow": False}},
        stop={"max_trials": 8},
    )
    quantune.tune(config, output=tmp_path / "out")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    scores = next(iter(results["strategy"]["sensitivity"].values()))
    assert {"conv1", "conv2", "fc"} <= set(scores) and all(v["score"] is not None for v in scores.values())
    page = (tmp_path / "out" / "report.html").read_text()
    assert "precision map of the closest miss" in page
    fell = excluded(results["closest_miss"]["params"])
    assert set(fell) & set(scores)  # the bisection kept compute groups in fp32 ...
    assert "kept in fp32 by the search; sensitivity" in page  # ... and the page gives their scores as the reason
