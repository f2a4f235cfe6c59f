"""fp16 conversion through real onnxruntime, and its pruning rules."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import quantune
from bert_model import bert_inputs, build_bert_layer
from conftest import run_model
from quantune.passes import PassContext
from quantune.prepare import model_facts

Float16 = quantune.get_pass("fp16")


def convert(model: Path, work: Path, **params) -> Path:
    out = work / f"fp16-{len(list(work.glob('fp16-*.onnx')))}.onnx"
    Float16().run(Float16.Config(**params), model, out, PassContext(None, ["x", "mask"], 4, work))
    return out


def initializer_types(path: Path) -> dict[str, int]:
    return {init.name: init.data_type for init in onnx.load(str(path)).graph.initializer}


@pytest.fixture
def bert(tmp_path: Path) -> Path:
    return build_bert_layer(tmp_path / "bert.onnx")


def test_weights_halve_io_stays_float32_and_outputs_stay_close(bert, tmp_path):
    out = convert(bert, tmp_path, keep_fp32="none")
    types = initializer_types(out)
    assert types["wq"] == TensorProto.FLOAT16 and types["ln0_g"] == TensorProto.FLOAT16
    assert out.stat().st_size < 0.6 * bert.stat().st_size
    graph = onnx.load(str(out)).graph
    assert [value.type.tensor_type.elem_type for value in graph.output] == [TensorProto.FLOAT]
    feeds = bert_inputs(4, seed=2)
    result = run_model(out, feeds)[0]
    assert result.dtype == np.float32
    assert float(np.abs(result - run_model(bert, feeds)[0]).max()) < 0.05


def test_numeric_block_list_keeps_normalizations_in_float32(bert, tmp_path):
    types = initializer_types(convert(bert, tmp_path, keep_fp32="numeric"))
    assert types["ln0_g"] == TensorProto.FLOAT and types["wq"] == TensorProto.FLOAT16
    assert (
        initializer_types(convert(bert, tmp_path, keep_fp32="none", op_block_list=["MatMul"]))["wq"]
        == TensorProto.FLOAT
    )


def test_nodes_to_exclude_stay_float32(bert, tmp_path):
    types = initializer_types(convert(bert, tmp_path, keep_fp32="none", nodes_to_exclude=["matmul_q"]))
    assert types["wq"] == TensorProto.FLOAT and types["wk"] == TensorProto.FLOAT16


def test_not_after_a_quantizer_nor_twice():
    for name in ("static_quant", "dynamic_quant", "weight_only", "fp16"):
        upstream = [(name, quantune.get_pass(name).Config())]
        assert not Float16.accepts(Float16.Config(), upstream), name
    assert Float16.accepts(Float16.Config(), [("transformer_opt", quantune.get_pass("transformer_opt").Config())])


def test_a_model_of_blocked_ops_only_is_pruned(bert):
    facts = model_facts(onnx.load(str(bert)))
    assert Float16.supports(Float16.Config(), facts, [])
    only_numeric = {"opset": 17, "op_types": {"Softmax": 1, "Reshape": 2}}
    assert not Float16.supports(Float16.Config(keep_fp32="numeric"), only_numeric, [])
    assert Float16.supports(Float16.Config(keep_fp32="none"), only_numeric, [])


def test_a_size_first_run_can_choose_the_fp16_model(make_config, tmp_path):
    """An fp16 model quantizes nothing, yet it is not the original in disguise: it halves the size."""
    from quantune.evaluate.quantized import quantization_figures

    config = make_config([{"name": "fp16", "search": True}], objective="size", stop={"max_trials": 2})
    result = quantune.tune(config, output=tmp_path / "run")
    assert result.best is not None, result.verdict_reason
    assert result.best.metrics["quantized_ops"] == 0 and result.best.metrics["float16_ops"] > 0
    assert result.verdict == "improved"
    assert quantization_figures(config["model"])["float16_ops"] == 0
