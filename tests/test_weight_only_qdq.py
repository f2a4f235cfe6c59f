"""weight_only_qdq (int4 DequantizeLinear -> MatMul) on a tiny BERT layer through onnxruntime, and
the proof that a new pass is one file: the engine, the strategies, the other passes and the
evaluation treat it right from its traits alone (no list of pass names names it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from pydantic import ValidationError

import quantune
from bert_model import bert_inputs, build_bert_layer
from conftest import run_model
from quantune.config import load_config
from quantune.engine.plan.plan import build_plan
from quantune.evaluate import quantization_figures
from quantune.passes import PassContext
from quantune.prepare import model_facts

QDQ = quantune.get_pass("weight_only_qdq")


@pytest.fixture
def bert(tmp_path: Path) -> Path:
    return build_bert_layer(tmp_path / "bert.onnx")


def quantize(model: Path, work: Path, **params) -> Path:
    out = work / f"qdq-{len(list(work.glob('qdq-*.onnx')))}.onnx"
    QDQ().run(QDQ.Config(**params), model, out, PassContext(None, ["x", "mask"], 4, work))
    return out


def ops(path: Path, op_type: str) -> list[onnx.NodeProto]:
    return [node for node in onnx.load(str(path)).graph.node if node.op_type == op_type]


def test_weights_become_int4_dequantize_linear_that_onnxruntime_fuses(bert, tmp_path):
    out = quantize(bert, tmp_path)
    model = onnx.load(str(out))
    dq = ops(out, "DequantizeLinear")
    assert len(dq) == 6  # q, k, v, o, ffn in/out; the 2 activation MatMuls stay float
    weights = {init.name: init.data_type for init in model.graph.initializer}
    assert {weights[node.input[0]] for node in dq} == {onnx.TensorProto.INT4}
    assert out.stat().st_size < 0.4 * bert.stat().st_size
    feeds = bert_inputs(4, seed=11)
    assert np.abs(run_model(out, feeds)[0] - run_model(bert, feeds)[0]).max() < 0.5  # layer-normed outputs
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "loaded.onnx")
    ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
    assert len(ops(tmp_path / "loaded.onnx", "MatMulNBits")) == 6  # what the CPU provider runs


def test_nodes_to_exclude_and_asymmetric_blocks(bert, tmp_path):
    out = quantize(bert, tmp_path, nodes_to_exclude=["matmul_ffn_out"], symmetric=False, block_size=64)
    assert len(ops(out, "DequantizeLinear")) == 5
    assert "matmul_ffn_out" in {node.name for node in ops(out, "MatMul")}
    assert all(len(node.input) == 3 for node in ops(out, "DequantizeLinear"))  # zero points


@pytest.mark.parametrize("params", [{"block_size": 48}, {"block_size": 8}, {"bits": 8}])
def test_configs_onnxruntime_cannot_write_are_invalid(params):
    with pytest.raises(ValidationError):
        QDQ.Config(**params)


def test_a_later_dynamic_quant_takes_its_model(bert, tmp_path):
    """``flows: auto`` places it before dynamic_quant (the MatMuls it leaves float may go int8)."""
    out = quantize(bert, tmp_path, nodes_to_exclude=["matmul_ffn_out"])
    dynamic = quantune.get_pass("dynamic_quant")
    final = tmp_path / "both.onnx"
    dynamic().run(dynamic.Config(), out, final, PassContext(None, ["x", "mask"], 4, tmp_path))
    assert ops(final, "MatMulInteger") and run_model(final, bert_inputs(2, seed=3))[0].shape == (2, 12, 64)


def test_its_traits_place_it_order_it_and_count_it(bert, tmp_path, make_config):
    # the other passes read its traits: nothing that needs float weights follows it
    assert not quantune.get_pass("weight_only").accepts(quantune.get_pass("weight_only").Config(), [(QDQ.name, None)])
    assert not quantune.get_pass("fp16").accepts(quantune.get_pass("fp16").Config(), [(QDQ.name, None)])
    assert not QDQ.accepts(QDQ.Config(), [("weight_only", None)])
    # flows: auto places it like weight_only
    passes = [{"name": name, "search": True} for name in ("transformer_opt", "dynamic_quant", "weight_only_qdq")]
    config = load_config(make_config(passes, model=str(bert), flows="auto")).config
    flows = list(build_plan(config, facts=model_facts(onnx.load(str(bert)))).flows)
    assert flows == [
        "dynamic_quant",
        "transformer_opt",
        "transformer_opt>dynamic_quant",
        "transformer_opt>weight_only_qdq",
        "weight_only_qdq",
        "weight_only_qdq>dynamic_quant",
    ]
    # its model counts as quantized (its MatMuls compute in float in the graph, fused on load)
    out = quantize(bert, tmp_path)
    assert quantization_figures(out)["quantized_ops"] == 0  # what "quantizes nothing" would say
    assert quantization_figures(out, QDQ.leaves_quantized)["quantized_ops"] == 6


def test_accuracy_strategies_and_a_run_take_it(make_config, tmp_path):
    """A quant step for the accuracy strategies (fallback through ``nodes_to_exclude``), and a run
    whose trials are candidates (not "quantizes nothing")."""
    from conftest import accuracy_problem
    from quantune.strategy.accuracy.context import AccuracyContext

    bert = build_bert_layer(tmp_path / "bert.onnx")
    np.savez(tmp_path / "calib.npz", **bert_inputs(8, seed=1))
    np.savez(tmp_path / "eval.npz", **bert_inputs(8, seed=2))
    config = make_config(
        [{"name": "weight_only_qdq", "search": True}],
        model=str(bert),
        data={"calibration": str(tmp_path / "calib.npz"), "evaluation": str(tmp_path / "eval.npz"), "batch_size": 4},
        evaluation={"metric": "cosine", "latency": {"warmup": 1, "repeats": 3, "threads": 1}},
        criterion={"type": "relative", "tolerable_loss": 0.05},
        objective="size",
        search={"sampler": "random", "seed": 0},
        stop={"max_trials": 2},
    )
    context = AccuracyContext.from_problem(accuracy_problem(config), "mse_v2")
    assert context.dynamic and context.quant_step == "weight_only_qdq"
    matmuls = [group for group in context.candidates if group.op_type == "MatMul"]
    assert len(matmuls) == 6
    point = context.with_fallback(context.base_point(), context.fallback_of(matmuls[0].nodes))
    assert point["weight_only_qdq.nodes_to_exclude"] == list(matmuls[0].nodes)

    result = quantune.tune(config, tmp_path / "run")
    assert [trial.status for trial in result.trials] == ["ok", "ok"]
    assert all(trial.metrics["quantized_ops"] == 6 for trial in result.trials)
    assert result.best is not None and result.best.metrics["size_bytes"] < result.baseline["size_bytes"]
