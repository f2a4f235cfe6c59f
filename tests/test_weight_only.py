"""weight_only (MatMulNBits) on tiny real models through onnxruntime, and each pruning rule."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from pydantic import ValidationError

import quantune
from bert_model import bert_inputs, build_bert_layer
from conftest import build_cnn, run_model
from quantune.config import load_config
from quantune.engine.plan.plan import build_plan
from quantune.passes import PassContext
from quantune.prepare import model_facts

WeightOnly = quantune.get_pass("weight_only")


def quantize(model: Path, work: Path, **params) -> Path:
    out = work / f"wo-{len(list(work.glob('wo-*.onnx')))}.onnx"
    WeightOnly().run(WeightOnly.Config(**params), model, out, PassContext(None, ["x", "mask"], 4, work))
    return out


def nodes(path: Path, op_type: str) -> list[onnx.NodeProto]:
    return [node for node in onnx.load(str(path)).graph.node if node.op_type == op_type]


@pytest.fixture
def bert(tmp_path: Path) -> Path:
    return build_bert_layer(tmp_path / "bert.onnx")


def error(model: Path, reference: Path) -> float:
    feeds = bert_inputs(4, seed=11)
    return float(np.abs(run_model(model, feeds)[0] - run_model(reference, feeds)[0]).max())


@pytest.mark.parametrize("bits", [4, 8])
def test_matmul_weights_become_matmulnbits_and_the_model_shrinks(bert, tmp_path, bits):
    out = quantize(bert, tmp_path, bits=bits)
    packed = nodes(out, "MatMulNBits")
    assert len(packed) == 6 and not nodes(out, "MatMul")[2:]  # q, k, v, o, ffn in/out; the 2 activation MatMuls stay
    assert {next(a.i for a in node.attribute if a.name == "bits") for node in packed} == {bits}
    assert out.stat().st_size < 0.6 * bert.stat().st_size
    assert error(out, bert) < (0.5 if bits == 4 else 0.05)  # layer-normed outputs (unit scale)


def test_eight_bits_are_closer_than_four(bert, tmp_path):
    assert error(quantize(bert, tmp_path, bits=8), bert) < error(quantize(bert, tmp_path, bits=4), bert)


def test_nodes_to_exclude_keep_a_matmul_in_float(bert, tmp_path):
    out = quantize(bert, tmp_path, nodes_to_exclude=["matmul_ffn_out"])
    assert "matmul_ffn_out" in {node.name for node in nodes(out, "MatMul")}
    assert len(nodes(out, "MatMulNBits")) == 5


def test_accuracy_level_and_block_size_are_written(bert, tmp_path):
    out = quantize(bert, tmp_path, accuracy_level=4, block_size=64, symmetric=False)
    for node in nodes(out, "MatMulNBits"):
        attributes = {a.name: a.i for a in node.attribute}
        assert attributes["accuracy_level"] == 4 and attributes["block_size"] == 64
        assert len(node.input) >= 4 and node.input[3]  # asymmetric: zero points


def test_embedding_tables_are_quantized_on_request(tmp_path):
    """A Gather on a constant table becomes GatherBlockQuantized (4 bits)."""
    from onnx import TensorProto, helper

    from conftest import save_graph

    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.normal(0, 1, (100, 64)).astype(np.float32), "table")
    weight = numpy_helper.from_array(rng.normal(0, 0.2, (64, 32)).astype(np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
            helper.make_node("MatMul", ["e", "w"], ["y"], name="proj"),
        ],
        "embed",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5, 32])],
        [table, weight],
    )
    model = save_graph(graph, tmp_path / "embed.onnx")
    out = quantize(model, tmp_path, embeddings=True)
    assert nodes(out, "GatherBlockQuantized") and nodes(out, "MatMulNBits")
    ids = {"ids": rng.integers(0, 100, (3, 5)).astype(np.int64)}
    reference = run_model(model, ids)[0]
    assert float(np.abs(run_model(out, ids)[0] - reference).max()) < 0.2 * float(np.abs(reference).max())


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="hqq needs torch")
def test_hqq_quantizes_with_the_accuracy_level_set(bert, tmp_path):
    out = quantize(bert, tmp_path, algorithm="hqq", accuracy_level=4)
    assert all({a.name: a.i for a in n.attribute}["accuracy_level"] == 4 for n in nodes(out, "MatMulNBits"))
    assert error(out, bert) < 0.5


@pytest.mark.parametrize(
    "params",
    [
        {"algorithm": "hqq", "bits": 8},  # onnxruntime's CPU kernel refuses HQQ's 8-bit form
        {"block_size": 48},  # not a power of two
        {"block_size": 8},  # below MatMulNBits' smallest block
        {"embeddings": True, "bits": 8},  # GatherBlockQuantized is 4-bit only
    ],
)
def test_configs_onnxruntime_cannot_run_are_invalid(params):
    with pytest.raises(ValidationError):
        WeightOnly.Config(**params)


def test_supports_needs_a_constant_matmul_weight(bert, tmp_path):
    config = WeightOnly.Config()
    assert WeightOnly.supports(config, model_facts(onnx.load(str(bert))), [])
    cnn_facts = model_facts(onnx.load(str(build_cnn(tmp_path / "cnn.onnx"))))
    assert cnn_facts["matmul_weights"] == []
    assert not WeightOnly.supports(config, cnn_facts, [])
    everything = [name for name, _, _ in model_facts(onnx.load(str(bert)))["matmul_weights"]]
    assert not WeightOnly.supports(
        WeightOnly.Config(nodes_to_exclude=everything), model_facts(onnx.load(str(bert))), []
    )
    assert WeightOnly.supports(config, {"opset": 17}, [])  # facts without the key prune nothing


def test_block_sizes_past_every_weight_depth_are_pruned(bert, tmp_path, make_config):
    """The deepest weight here has K = 128: a 256 or 512 block is one padded block per column, the
    same model as 128, so only 32, 64 and 128 remain."""
    facts = model_facts(onnx.load(str(bert)))
    assert {k for _, k, _ in facts["matmul_weights"]} == {64, 128}
    passes = [{"name": "weight_only", "params": {"block_size": {"search": [32, 64, 128, 256, 512]}}}]
    config = load_config(make_config(passes, model=str(bert))).config
    sizes = {point["weight_only.block_size"] for point in build_plan(config, facts=facts).space.iterate()}
    assert sizes == {32, 64, 128}


def test_accuracy_strategies_fall_back_through_nodes_to_exclude(make_config, tmp_path):
    """weight_only is a quant step for the accuracy strategies: its groups are the MatMuls it
    touches, and a group kept in float lands in ``weight_only.nodes_to_exclude``."""
    from conftest import accuracy_problem
    from quantune.strategy.accuracy.context import AccuracyContext

    bert = build_bert_layer(tmp_path / "bert.onnx")
    np.savez(tmp_path / "calib.npz", **bert_inputs(8, seed=1))
    np.savez(tmp_path / "eval.npz", **bert_inputs(8, seed=2))
    config = make_config(
        [{"name": "weight_only", "search": True}],
        model=str(bert),
        data={"calibration": str(tmp_path / "calib.npz"), "evaluation": str(tmp_path / "eval.npz"), "batch_size": 4},
        evaluation={"metric": "cosine"},
    )
    context = AccuracyContext.from_problem(accuracy_problem(config), "mse_v2")
    assert context.dynamic and context.quant_step == "weight_only"
    matmuls = [group for group in context.candidates if group.op_type == "MatMul"]
    assert len(matmuls) == 6
    point = context.with_fallback(context.base_point(), context.fallback_of(matmuls[0].nodes))
    assert point["weight_only.nodes_to_exclude"] == list(matmuls[0].nodes)
