"""transformer_opt on a tiny BERT layer through real onnxruntime, and each pruning rule around it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

import quantune
from bert_model import bert_inputs, build_bert_layer
from conftest import build_cnn, run_model
from quantune.config import load_config
from quantune.data import Dataset
from quantune.engine.plan.plan import build_plan
from quantune.errors import TrialError
from quantune.passes import PassContext
from quantune.prepare import model_facts


def run_pass(name: str, params: dict, model_in: Path, work: Path, calibration: Dataset | None = None) -> Path:
    pass_cls = quantune.get_pass(name)
    out = work / f"{name}-{len(list(work.glob('*.onnx')))}.onnx"
    pass_cls().run(pass_cls.Config(**params), model_in, out, PassContext(calibration, ["x", "mask"], 4, work))
    return out


def ops(path: Path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path)).graph.node}


@pytest.fixture
def bert(tmp_path: Path) -> Path:
    return build_bert_layer(tmp_path / "bert.onnx")


def facts_of(path: Path) -> dict:
    return model_facts(onnx.load(str(path)))


def plan_points(make_config, model: Path, passes: list[dict], facts: dict, **extra) -> list[dict]:
    config = load_config(make_config(passes, model=str(model), **extra)).config
    return list(build_plan(config, facts=facts).space.iterate())


def test_fuses_attention_skip_layer_norm_and_bias_gelu_keeping_outputs(bert, tmp_path):
    fused = run_pass("transformer_opt", {}, bert, tmp_path)
    assert {"Attention", "SkipLayerNormalization", "BiasGelu"} <= ops(fused)
    assert not {"Softmax", "Erf"} & ops(fused), "the attention and GELU subgraphs should be gone"
    feeds = bert_inputs(4, seed=3)
    np.testing.assert_allclose(run_model(fused, feeds)[0], run_model(bert, feeds)[0], atol=1e-4)


def test_fusion_options_are_honoured(bert, tmp_path):
    approximated = run_pass("transformer_opt", {"gelu_approximation": True}, bert, tmp_path)
    assert "FastGelu" in ops(approximated) and "BiasGelu" not in ops(approximated)
    unfused = run_pass("transformer_opt", {"attention": False}, bert, tmp_path)
    assert "Attention" not in ops(unfused) and "Softmax" in ops(unfused)
    # onnxruntime's own optimizer first (no torch needed): level 1 keeps the attention pattern;
    # level 2 fuses SkipLayerNormalization itself, after which this graph's attention no longer
    # matches (MiniLM's still does) -- a real trade-off the search measures
    assert "Attention" in ops(run_pass("transformer_opt", {"opt_level": 1}, bert, tmp_path))
    assert {"SkipLayerNormalization", "BiasGelu"} <= ops(run_pass("transformer_opt", {"opt_level": 2}, bert, tmp_path))


def test_run_refuses_a_model_with_nothing_to_fuse(tmp_path):
    with pytest.raises(TrialError, match="nothing fused"):
        run_pass("transformer_opt", {}, build_cnn(tmp_path / "cnn.onnx"), tmp_path)


def test_supports_only_transformers(tmp_path, bert):
    cls = quantune.get_pass("transformer_opt")
    config = cls.Config()
    assert cls.supports(config, facts_of(bert), [])
    assert not cls.supports(config, facts_of(build_cnn(tmp_path / "cnn.onnx")), [])
    assert cls.supports(config, {"opset": 17}, [])  # facts recorded before op_types existed prune nothing


def test_transformer_opt_on_a_cnn_prunes_every_point(make_config, cnn_model):
    passes = [{"name": "transformer_opt", "search": True}]
    assert plan_points(make_config, cnn_model, passes, facts_of(cnn_model)) == []


def test_accepts_only_a_fresh_or_lightly_optimized_graph():
    cls = quantune.get_pass("transformer_opt")
    graph_opt, dynamic = quantune.get_pass("graph_opt"), quantune.get_pass("dynamic_quant")
    config = cls.Config()
    assert cls.accepts(config, [("graph_opt", graph_opt.Config(level="basic"))])
    assert not cls.accepts(config, [("graph_opt", graph_opt.Config(level="extended"))])
    assert not cls.accepts(config, [("dynamic_quant", dynamic.Config())])


class _Reader(CalibrationDataReader):
    def __init__(self) -> None:
        self.feeds = iter([bert_inputs(2, seed) for seed in range(3)])

    def get_next(self):
        return next(self.feeds, None)


def test_qoperator_after_fusion_fails_in_onnxruntime_and_is_pruned(bert, tmp_path, make_config):
    fused = run_pass("transformer_opt", {}, bert, tmp_path)
    with pytest.raises(AttributeError):  # the rule's reason, on this onnxruntime
        quantize_static(str(fused), str(tmp_path / "qop.onnx"), _Reader(), quant_format=QuantFormat.QOperator)
    passes = [
        {"name": "transformer_opt"},
        {"name": "static_quant", "params": {"quant_format": {"search": ["QDQ", "QOperator"]}}},
    ]
    points = plan_points(make_config, bert, passes, facts_of(bert))
    assert {point["static_quant.quant_format"] for point in points} == {"QDQ"}


def test_dynamic_and_qdq_quantize_the_fused_ops(bert, tmp_path):
    fused = run_pass("transformer_opt", {}, bert, tmp_path)
    feeds = bert_inputs(4, seed=5)
    reference = run_model(bert, feeds)[0]
    dynamic = run_pass("dynamic_quant", {}, fused, tmp_path)
    assert "QAttention" in ops(dynamic)
    calibration = Dataset(bert_inputs(16, seed=1), "data.calibration")
    qdq = run_pass("static_quant", {}, fused, tmp_path, calibration)
    assert "QuantizeLinear" in ops(qdq) and "Attention" in ops(qdq)
    for model in (dynamic, qdq):  # layer-normed outputs: unit scale
        assert float(np.abs(run_model(model, feeds)[0] - reference).max()) < 0.5


def test_quantizers_after_fp16_are_pruned():
    fp16 = quantune.get_pass("fp16")
    for name in ("static_quant", "dynamic_quant"):
        cls = quantune.get_pass(name)
        assert not cls.accepts(cls.Config(), [("fp16", fp16.Config())]), name
        assert cls.accepts(cls.Config(), [("weight_only", quantune.get_pass("weight_only").Config())]), name


def test_a_fused_flows_fallback_names_nodes_of_the_fused_model(bert, tmp_path):
    """The groups of a quant step after transformer_opt come from the fused model: excluding an
    unfused Q/K/V MatMul (gone into Attention) would change nothing."""
    from conftest import accuracy_problem
    from quantune.strategy.accuracy.context import AccuracyContext

    np.savez(tmp_path / "calib.npz", **bert_inputs(16, seed=1))
    np.savez(tmp_path / "eval.npz", **bert_inputs(16, seed=2))
    config = {
        "model": str(bert),
        "data": {"calibration": str(tmp_path / "calib.npz"), "evaluation": str(tmp_path / "eval.npz"), "batch_size": 4},
        "evaluation": {"metric": "cosine"},
        "passes": [{"name": "transformer_opt"}, {"name": "dynamic_quant", "search": True}],
        "flows": [["dynamic_quant"], ["transformer_opt", "dynamic_quant"]],
        "search": {"strategy": "quantune"},
        "cache_dir": str(tmp_path / "cache"),
    }
    contexts = {ctx.flow: ctx for ctx in AccuracyContext.all_from_problem(accuracy_problem(config), "quantune")}
    plain, fused = contexts[("dynamic_quant",)], contexts[("transformer_opt", "dynamic_quant")]
    fused_model = run_pass("transformer_opt", {}, bert, tmp_path)
    fused_names = {node.name for node in onnx.load(str(fused_model)).graph.node}
    assert {g.name for g in fused.candidates} <= fused_names
    assert "Attention" in {g.op_type for g in fused.candidates}
    assert {g.name for g in plain.candidates} - fused_names, "fusion renamed nothing: the test shows nothing"
    point = fused.with_fallback(fused.base_point(), {fused.candidates[0].name: "fp32"})
    assert set(point["dynamic_quant.nodes_to_exclude"]) <= fused_names
