"""Model preparation: each step on a model built to need it, the equivalence check, the cache,
``prepare: off``, and points the prepared model cannot run pruned before they run."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console

import quantune
from conftest import CNN_CLASSES, cnn_inputs, run_model
from quantune.cli import main
from quantune.config import load_config
from quantune.data import load_dataset
from quantune.engine.plan.plan import build_plan
from quantune.engine.trials.setup import build_run, prepare_for_run
from quantune.errors import ConfigError
from quantune.model import ModelHandle
from quantune.passes import get_pass
from quantune.prepare import (
    DEFAULT_STEPS,
    PrepareOptions,
    PrepareStep,
    model_facts,
    prepare_model,
)
from quantune.prepare.check import outputs_differ, run_feeds
from quantune.report.console import ConsoleListener
from quantune.store import ArtifactCache

FEEDS = [{"input": cnn_inputs(8, seed=3)}]


def build_variant(
    path: Path,
    *,
    opset: int = 17,
    constant_weights: bool = False,
    batch_norm: bool = False,
    computed_bias: bool = False,
    seed: int = 0,
) -> Path:
    """build_cnn's Conv -> Relu -> Conv -> GlobalAveragePool -> Flatten -> Gemm in the form an
    exporter may leave it: weights as Constant nodes, an unfused BatchNorm after the first Conv,
    the second Conv's bias computed by an Add of two constants, or an older opset."""
    rng = np.random.default_rng(seed)
    arrays = {
        "w1": rng.normal(0, 0.5, (8, 1, 3, 3)),
        "b1": rng.normal(0, 0.1, (8,)),
        "w2": rng.normal(0, 0.3, (8, 8, 3, 3)),
        "b2": rng.normal(0, 0.1, (8,)),
        "wf": rng.normal(0, 0.5, (CNN_CLASSES, 8)),
        "bf": rng.normal(0, 0.1, (CNN_CLASSES,)),
    }
    nodes: list[onnx.NodeProto] = []
    if batch_norm:
        arrays.update(
            scale=rng.uniform(0.5, 1.5, (8,)),
            shift=rng.normal(0, 0.1, (8,)),
            mean=rng.normal(0, 0.1, (8,)),
            var=rng.uniform(0.5, 1.5, (8,)),
        )
        nodes += [
            helper.make_node("Conv", ["input", "w1"], ["c0"], name="conv1", pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", ["c0", "scale", "shift", "mean", "var"], ["c1"], name="bn1"),
        ]
    else:
        nodes.append(helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("Relu", ["c1"], ["r1"], name="relu1"))
    if computed_bias:
        arrays["b2_offset"] = np.full((8,), 0.05)
        arrays["b2_base"] = arrays.pop("b2")
        nodes.append(helper.make_node("Add", ["b2_base", "b2_offset"], ["b2"], name="bias_add"))
    nodes += [
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], name="fc", transB=1),
    ]
    tensors = [numpy_helper.from_array(value.astype(np.float32), name) for name, value in arrays.items()]
    initializers = tensors
    if constant_weights:
        constants = [helper.make_node("Constant", [], [t.name], name=f"{t.name}_const", value=t) for t in tensors]
        nodes, initializers = constants + nodes, []
    graph = helper.make_graph(
        nodes,
        "variant",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CNN_CLASSES])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def op_types(path: Path) -> list[str]:
    return [node.op_type for node in onnx.load(str(path)).graph.node]


def tune(make_config, tmp_path: Path, model: Path, passes, **overrides):
    config = make_config(passes, model=str(model), **overrides)
    config["evaluation"]["metric"] = "top1_agreement"
    return quantune.tune(config, tmp_path / "run", restart=True)


# -- the steps, each on a model built to need it ------------------------------------------------


def test_constant_weights_become_initializers_and_dynamic_quant_runs(tmp_path, make_config):
    model = build_variant(tmp_path / "const.onnx", constant_weights=True)
    result = tune(make_config, tmp_path, model, None)  # make_config's default: dynamic_quant, 2 points
    assert [t.status for t in result.trials] == ["ok", "ok"], [t.error for t in result.trials]
    steps = result.preparation["steps"]
    assert any("Constant node(s) -> initializers" in line for line in steps), steps
    prepared = Path(result.preparation["model"])
    assert "Constant" not in op_types(prepared) and "Constant" in op_types(model)
    written = json.loads((tmp_path / "run" / "results.json").read_text())
    assert written["preparation"]["steps"] == steps


def test_opset_12_is_raised_and_per_channel_qdq_runs(tmp_path, make_config):
    model = build_variant(tmp_path / "op12.onnx", opset=12)
    result = tune(make_config, tmp_path, model, [{"name": "static_quant", "params": {"per_channel": True}}])
    assert result.trials[0].status == "ok", result.trials[0].error
    assert "opset 12 -> 13" in result.preparation["steps"]
    assert model_facts(onnx.load(str(model)))["opset"] == 12  # the user's file is untouched
    assert "prepared (miss): opset 12 -> 13" in (tmp_path / "run" / "quantune.log").read_text()


def test_the_console_prints_one_line_per_change(tmp_path, make_config):
    model = build_variant(tmp_path / "op12.onnx", opset=12, batch_norm=True)
    console = Console(file=io.StringIO(), width=200)
    config = make_config([{"name": "static_quant"}], model=str(model))
    quantune.tune(config, tmp_path / "run", listeners=[ConsoleListener(console)])
    lines = [line for line in console.file.getvalue().splitlines() if line.startswith("prepared: ")]
    assert lines[0] == "prepared: opset 12 -> 13"
    assert "BatchNormalization -1" in lines[1] and len(lines) == 2


def test_a_model_at_the_needed_opset_is_left_alone(tmp_path):
    preparation = prepare_model(
        ModelHandle.from_path(build_variant(tmp_path / "m.onnx", opset=15)),
        FEEDS,
        ArtifactCache(tmp_path / "cache"),
        PrepareOptions(opset=13),
    )
    assert not any(line.startswith("opset") for line in preparation.steps)
    assert preparation.facts["opset"] == 15


def test_unfused_batch_norm_is_folded_into_its_conv(tmp_path):
    model = build_variant(tmp_path / "bn.onnx", batch_norm=True)
    preparation = prepare_model(ModelHandle.from_path(model), FEEDS, ArtifactCache(tmp_path / "cache"))
    assert "BatchNormalization" in op_types(model)
    assert "BatchNormalization" not in op_types(preparation.model)
    assert any("BatchNormalization -1" in line for line in preparation.steps), preparation.steps
    feeds = {"input": cnn_inputs(16, seed=9)}
    np.testing.assert_allclose(run_model(preparation.model, feeds)[0], run_model(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_computed_bias_is_folded_and_qoperator_runs(tmp_path, make_config):
    model = build_variant(tmp_path / "bias.onnx", computed_bias=True)
    assert model_facts(onnx.load(str(model)))["computed_biases"] == [["conv2", "Conv"]]
    result = tune(make_config, tmp_path, model, [{"name": "static_quant", "params": {"quant_format": "QOperator"}}])
    assert result.trials[0].status == "ok", result.trials[0].error
    assert model_facts(onnx.load(result.preparation["model"]))["computed_biases"] == []


def test_prepare_off_leaves_the_model_as_it_is(tmp_path, make_config):
    model = build_variant(tmp_path / "op12.onnx", opset=12, batch_norm=True)
    config = make_config(model=str(model), prepare="off")
    parts = build_run(load_config(config))
    assert parts.context.start.path == model.resolve()
    assert parts.context.preparation.steps == [] and parts.context.preparation.facts["opset"] == 12
    result = tune(make_config, tmp_path, model, None, prepare="off")
    assert result.preparation["steps"] == [] and Path(result.preparation["model"]) == model.resolve()


def test_prepare_off_unquoted_in_yaml_means_off(tmp_path, make_config):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(make_config()) + "prepare: off\n")
    assert load_config(path).config.prepare == "off"


def test_the_baseline_is_the_original_model(tmp_path, make_config):
    model = build_variant(tmp_path / "bn.onnx", batch_norm=True)
    parts = build_run(load_config(make_config(model=str(model))))
    assert parts.context.model.path == model.resolve()
    assert parts.context.start.path != model.resolve()  # trials start from the prepared model


# -- the equivalence check ----------------------------------------------------------------------


def test_outputs_differ_tells_different_models_apart(tmp_path):
    first = build_variant(tmp_path / "a.onnx", seed=0)
    other = build_variant(tmp_path / "b.onnx", seed=1)
    folded = build_variant(tmp_path / "c.onnx", seed=0, computed_bias=False, opset=13)
    assert outputs_differ(run_feeds(first, FEEDS), run_feeds(other, FEEDS)) is not None
    assert "max difference" in outputs_differ(run_feeds(first, FEEDS), run_feeds(other, FEEDS))
    assert outputs_differ(run_feeds(first, FEEDS), run_feeds(folded, FEEDS)) is None


def _breaks_outputs(model: onnx.ModelProto, options: PrepareOptions, work: Path):
    """A step that rewrites the model into something else: scales the last layer's weights."""
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    for index, tensor in enumerate(broken.graph.initializer):
        if tensor.name == "wf":
            scaled = numpy_helper.from_array(numpy_helper.to_array(tensor) * 2.0, "wf")
            broken.graph.initializer[index].CopyFrom(scaled)
    return broken, ["wf doubled"]


def test_a_step_that_changes_the_outputs_is_dropped_with_a_warning(tmp_path):
    model = build_variant(tmp_path / "op12.onnx", opset=12)
    steps = (DEFAULT_STEPS[1], PrepareStep("breaker", _breaks_outputs))
    preparation = prepare_model(
        ModelHandle.from_path(model), FEEDS, ArtifactCache(tmp_path / "c"), PrepareOptions(13), steps
    )
    assert preparation.steps == ["opset 12 -> 13"]  # the step before it stands
    assert len(preparation.warnings) == 1 and "'breaker'" in preparation.warnings[0]
    assert outputs_differ(run_feeds(model, FEEDS), run_feeds(preparation.model, FEEDS)) is None


def test_a_step_that_raises_is_skipped_with_a_warning(tmp_path):
    def fails(model, options, work):
        raise RuntimeError("no adapter")

    model = build_variant(tmp_path / "m.onnx")
    preparation = prepare_model(
        ModelHandle.from_path(model), FEEDS, ArtifactCache(tmp_path / "c"), steps=(PrepareStep("opset", fails),)
    )
    assert preparation.model == model.resolve() and preparation.steps == []
    assert "'opset' failed" in preparation.warnings[0] and "no adapter" in preparation.warnings[0]


@pytest.mark.parametrize(("batch_dim", "rows"), [("N", 2), (16, 16)])
def test_the_check_runs_a_slice_of_a_batch_unless_the_batch_is_fixed(tmp_path, make_config, batch_dim, rows):
    """A heavy model's check stays cheap: an open batch dimension is checked on a few rows of a
    batch, a fixed one on the whole batch the model takes (the cache key holds the checked rows)."""
    path = build_variant(tmp_path / "m.onnx", opset=12)
    if batch_dim != "N":
        fixed = onnx.load(str(path))
        fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value = batch_dim
        onnx.save(fixed, str(path))
    config = load_config(make_config(model=str(path))).config  # evaluation batches of 16
    model, cache = ModelHandle.from_path(path), ArtifactCache(tmp_path / "c")
    evaluation = load_dataset(config.data.evaluation, field_name="data.evaluation", base_dir=tmp_path)
    assert prepare_for_run(config, model, evaluation, cache).cache == "miss"
    options = PrepareOptions(max(get_pass(entry.name).min_opset for entry in config.passes))
    rows_of = {count: [{"input": evaluation.arrays["input"][:count]}] for count in (2, 16)}
    assert prepare_model(model, rows_of[rows], cache, options).cache == "hit"
    assert prepare_model(model, rows_of[18 - rows], cache, options).cache == "miss"


# -- the cache ----------------------------------------------------------------------------------


def test_a_second_preparation_is_read_from_the_cache(tmp_path):
    calls: list[str] = []

    def counted(model, options, work):
        calls.append("run")
        return DEFAULT_STEPS[0].run(model, options, work)

    model = ModelHandle.from_path(build_variant(tmp_path / "const.onnx", constant_weights=True))
    cache = ArtifactCache(tmp_path / "cache")
    steps = (PrepareStep("constants", counted), *DEFAULT_STEPS[1:])
    first = prepare_model(model, FEEDS, cache, PrepareOptions(13), steps)
    second = prepare_model(model, FEEDS, cache, PrepareOptions(13), steps)
    assert calls == ["run"]
    assert (first.cache, second.cache) == ("miss", "hit")
    assert (second.model, second.sha256, second.steps, second.facts) == (
        first.model,
        first.sha256,
        first.steps,
        first.facts,
    )
    unchanged = ModelHandle.from_path(build_variant(tmp_path / "plain.onnx", opset=17))
    assert prepare_model(unchanged, FEEDS, cache, steps=steps[:1]).cache == "miss"
    assert prepare_model(unchanged, FEEDS, cache, steps=steps[:1]).cache == "hit"  # "nothing to do" is cached too


# -- pruning what the prepared model cannot run -------------------------------------------------


def test_per_channel_qdq_is_pruned_when_the_opset_stays_below_13(tmp_path, make_config):
    config = load_config(make_config([{"name": "static_quant", "params": {"per_channel": {"search": [False, True]}}}]))
    sizes = {
        opset: sum(1 for _ in build_plan(config.config, facts={"opset": opset}).space.iterate()) for opset in (12, 13)
    }
    assert sizes == {12: 1, 13: 2}


def test_dynamic_quant_is_pruned_on_constant_weights_unless_prepared(tmp_path, make_config):
    model = build_variant(tmp_path / "const.onnx", constant_weights=True)
    with pytest.raises(ConfigError, match="every point of the search space is pruned"):
        tune(make_config, tmp_path, model, None, prepare="off")
    # excluding the convolutions whose weights are computed makes the point runnable again
    passes = [{"name": "dynamic_quant", "params": {"nodes_to_exclude": ["conv1", "conv2"]}}]
    result = tune(make_config, tmp_path, model, passes, prepare="off")
    assert result.trials[0].status == "ok", result.trials[0].error


@pytest.mark.parametrize(("prepare", "expected"), [("off", 1), ("auto", 4)])
def test_quantune_space_counts_the_pruned_points(tmp_path, make_config, capsys, prepare, expected):
    model = build_variant(tmp_path / "op12.onnx", opset=12, computed_bias=True)
    params = {"per_channel": {"search": [False, True]}, "quant_format": {"search": ["QDQ", "QOperator"]}}
    config = make_config([{"name": "static_quant", "params": params}], model=str(model), prepare=prepare)
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["space", str(path)]) == 0
    out = capsys.readouterr().out
    # off: opset 12 prunes per-channel QDQ, the computed bias both QOperator points; auto fixes both
    assert re.search(rf"after pruning: {expected}\b", out), out
    assert ("prepared: opset 12 -> 13" in out) == (prepare == "auto")


def test_symbolic_shape_inference_loads_without_importing_torch() -> None:
    """onnxruntime.tools' __init__ imports torch when installed (seconds): the shape step does not."""
    import subprocess
    import sys

    code = (
        "import sys; from quantune.prepare.shapes import symbolic_shape_inference; "
        "assert symbolic_shape_inference().__name__ == 'SymbolicShapeInference'; "
        "print('torch' in sys.modules, 'onnxruntime.tools' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_symbolic_shapes_come_from_the_model_without_its_weights_and_keep_them() -> None:
    """Past an op onnx's inference does not know (com.microsoft FastGelu), symbolic inference shapes
    more; it runs on the model without its weights' values, and the result has every weight back."""
    from quantune.prepare.shapes import infer_shapes

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.random((8, 2048)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.random((2048, 4)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("FastGelu", ["m"], ["g"], domain="com.microsoft"),
        helper.make_node("MatMul", ["g", "w2"], ["m2"]),
        helper.make_node("Relu", ["m2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        weights,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)]
    )
    shaped, changes = infer_shapes(model)
    assert changes and "symbolic" in changes[0]
    assert {info.name for info in shaped.graph.value_info} >= {"m", "g", "m2"}
    assert list(shaped.graph.initializer) == list(model.graph.initializer)  # the values, not only the dims
    # a model onnx's inference shapes whole is left as it is (no symbolic pass over it)
    plain = helper.make_model(
        helper.make_graph(
            nodes[:1], "p", graph.input, [helper.make_tensor_value_info("m", TensorProto.FLOAT, None)], weights[:1]
        ),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    assert infer_shapes(plain) == (plain, [])


def test_the_opset_is_raised_on_the_model_without_its_weights_and_keeps_them(tmp_path, monkeypatch) -> None:
    """onnx's converter runs on the model without its weights' values: the same model as converting
    it whole; a result that touched a weight is not used (``with_weights`` refuses it)."""
    import quantune.model
    from quantune.model import with_weights, without_weights

    monkeypatch.setattr(quantune.model, "_KEPT_ELEMENTS", 16)  # this tiny model's weights count as weights
    from quantune.prepare.constants import constants_to_initializers
    from quantune.prepare.opset import raise_opset

    model = onnx.load(str(build_variant(tmp_path / "m.onnx", opset=12, constant_weights=True)))
    model, _ = constants_to_initializers(model)
    raised, changes = raise_opset(model, 13)
    assert changes == ["opset 12 -> 13"]
    assert raised == onnx.version_converter.convert_version(model, 13)
    light = without_weights(model)
    assert any(not init.raw_data for init in light.graph.initializer)
    assert with_weights(light, model) == model
    touched = without_weights(model)
    big = max(touched.graph.initializer, key=lambda init: np.prod(init.dims))
    big.dims[0] += 1
    assert with_weights(touched, model) is None
    dropped = without_weights(model)
    dropped.graph.initializer.remove(max(dropped.graph.initializer, key=lambda init: np.prod(init.dims)))
    assert with_weights(dropped, model) is None
