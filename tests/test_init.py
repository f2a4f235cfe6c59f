"""``quantune init``: on small models of each kind, the config it writes loads and passes the
preflight (``quantune check``) with the data given or the loader it writes; it never overwrites."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

import quantune
from conftest import build_cnn, run_model, save_graph
from quantune.cli import main
from quantune.starter import init_project, read_model

VOCAB = 50


def build_text(path: Path) -> Path:
    """Token ids [batch, seq] int64 and a mask -> embedding (Gather) -> one self-attention -> 3 classes."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (VOCAB, 8)).astype(np.float32), "emb"),
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 8)).astype(np.float32), "wq"),
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 3)).astype(np.float32), "wo"),
        numpy_helper.from_array(np.array([2], np.int64), "axis2"),
    ]
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["h0"], name="embed"),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Unsqueeze", ["maskf", "axis2"], ["mask3"], name="unsq"),
        helper.make_node("Mul", ["h0", "mask3"], ["h"], name="masked"),
        helper.make_node("MatMul", ["h", "wq"], ["q"], name="query"),
        helper.make_node("Transpose", ["h"], ["kt"], perm=[0, 2, 1], name="keys"),
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="qk"),
        helper.make_node("Softmax", ["scores"], ["attn"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["attn", "h"], ["ctx"], name="av"),
        helper.make_node("ReduceMean", ["ctx"], ["pooled"], axes=[1], keepdims=0, name="pool"),
        helper.make_node("MatMul", ["pooled", "wo"], ["logits"], name="out"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_text",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        inits,
    )
    return save_graph(graph, path)


def build_two_inputs(path: Path) -> Path:
    """a[N, 4] + b[N, 4] -> MatMul -> y[N, 2]."""
    w = numpy_helper.from_array(np.random.default_rng(1).normal(0, 1, (4, 2)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"], name="add"),
        helper.make_node("MatMul", ["s", "w"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes,
        "two_inputs",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        [w],
    )
    return save_graph(graph, path)


def _check(config: Path) -> dict[str, float]:
    loaded = quantune.load_config(config)
    assert loaded.base_dir == config.parent.resolve()
    return quantune.check(config)


def test_model_info_reads_inputs_dynamic_axes_and_op_mix(tmp_path):
    text = read_model(build_text(tmp_path / "text.onnx"))
    assert [spec.name for spec in text.inputs] == ["input_ids", "attention_mask"]
    assert text.inputs[0].dtype == "int64" and text.inputs[0].dims == ("batch", "sequence")
    assert text.inputs[0].vocabulary == VOCAB  # the Gather's table
    assert "attention" in text.kinds and "MatMul-heavy" in text.kinds
    cnn = read_model(build_cnn(tmp_path / "cnn.onnx"))
    assert cnn.kinds == ["conv-heavy"] and cnn.image_like
    assert cnn.outputs[0].name == "logits"


def test_image_folder_gets_a_loader_with_labels_and_passes_the_preflight(tmp_path):
    from PIL import Image

    model = build_cnn(tmp_path / "cnn.onnx")  # input [N, 1, 8, 8]
    rng = np.random.default_rng(3)
    for label in ("cats", "dogs"):
        (tmp_path / "photos" / label).mkdir(parents=True)
        for index in range(6):
            pixels = rng.integers(0, 256, (8, 8), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "photos" / label / f"{index}.png")
    project = tmp_path / "project"
    result = init_project(model, [str(tmp_path / "photos")], None, project / "quantune.yaml")
    assert result.source.kind == "images" and result.metric == "top1"
    assert {p.name for p in result.written} == {"quantune.yaml", "data.py", "metric.py"}
    config = yaml.safe_load((project / "quantune.yaml").read_text())
    assert config["data"]["evaluation"] == "data.py:evaluation"
    assert config["model"] == "../cnn.onnx"  # relative to the config's folder
    assert config["flows"][0] == ["static_quant"]  # a conv net: static int8 first
    figures = _check(project / "quantune.yaml")
    assert 0.0 <= figures["top1"] <= 1.0
    import importlib.util

    spec = importlib.util.spec_from_file_location("starter_data", project / "data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    evaluation = module.evaluation()
    assert evaluation["input"].shape == (9, 1, 8, 8) and sorted(set(evaluation["label"])) == [0, 1]
    assert len(module.calibration()["input"]) == 3  # every 4th of 12, disjoint from evaluation


def test_text_model_without_data_gets_ids_below_the_vocabulary(tmp_path):
    model = build_text(tmp_path / "text.onnx")
    result = init_project(model, None, None, tmp_path / "quantune.yaml")
    assert result.source.kind == "synthetic" and result.metric == "cosine"
    text = (tmp_path / "data.py").read_text()
    assert "'input_ids': (0, 50)" in text and "'sequence': 128" in text
    config = yaml.safe_load((tmp_path / "quantune.yaml").read_text())
    assert config["flows"][0] == ["dynamic_quant"]  # MatMul-heavy: dynamic first
    assert _check(tmp_path / "quantune.yaml")["cosine"] == pytest.approx(1.0)
    # metric.py: its signature and its docstring name this model's outputs and inputs
    metric = (tmp_path / "metric.py").read_text()
    assert "def score(outputs: dict, data: dict) -> float:" in metric
    assert "logits: float32 [batch, 3]" in metric and "input_ids: int64 [batch, sequence]" in metric


def test_multi_input_npz_is_used_directly(tmp_path):
    model = build_two_inputs(tmp_path / "two.onnx")
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=(40, 4)).astype(np.float32), rng.normal(size=(40, 4)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", a=a[:16], b=b[:16])
    labels = np.argmax(run_model(model, {"a": a, "b": b})[0], axis=1)
    np.savez(tmp_path / "eval.npz", a=a, b=b, label=labels)
    result = init_project(model, [str(tmp_path / "eval.npz"), str(tmp_path / "calib.npz")], None, tmp_path / "q.yaml")
    assert result.source.kind == "npz" and [p.name for p in result.written] == ["q.yaml"]
    config = yaml.safe_load((tmp_path / "q.yaml").read_text())
    assert config["data"] == {"calibration": "calib.npz", "evaluation": "eval.npz", "batch_size": 16}
    assert _check(tmp_path / "q.yaml")["top1"] == pytest.approx(1.0)


def test_npy_per_input_gets_a_loader(tmp_path):
    model = build_two_inputs(tmp_path / "two.onnx")
    rng = np.random.default_rng(5)
    (tmp_path / "arrays").mkdir()
    np.save(tmp_path / "arrays" / "a.npy", rng.normal(size=(20, 4)))  # float64: converted to the model's float32
    np.save(tmp_path / "arrays" / "b.npy", rng.normal(size=(20, 4)))
    result = init_project(model, [str(tmp_path / "arrays")], "l2", tmp_path / "project" / "quantune.yaml")
    assert result.source.kind == "arrays" and result.metric == "l2"
    assert _check(tmp_path / "project" / "quantune.yaml")["l2"] == 0.0


def test_init_never_overwrites_and_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    model = build_cnn(tmp_path / "cnn.onnx")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.py").write_text("# mine\n")
    assert main(["init", "cnn.onnx"]) == 2
    err = capsys.readouterr().err.strip()
    assert "data.py" in err and "never overwrites" in err and "\n" not in err
    assert (tmp_path / "data.py").read_text() == "# mine\n" and not (tmp_path / "quantune.yaml").exists()
    (tmp_path / "data.py").unlink()
    assert main(["init", str(model)]) == 0
    out = capsys.readouterr().out
    assert "quantune check quantune.yaml" in out and "quantune run quantune.yaml" in out
    before = (tmp_path / "quantune.yaml").read_text()
    assert main(["init", str(model)]) == 2
    assert (tmp_path / "quantune.yaml").read_text() == before


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--metric", "f1"], "--metric f1: not a metric"),
        (["--metric", "top1"], "has no labels"),
        (["--data", "missing"], "no file or folder"),
    ],
)
def test_init_mistakes_are_one_line(tmp_path, capsys, args, needle):
    model = build_cnn(tmp_path / "cnn.onnx")
    assert main(["init", str(model), "--output", str(tmp_path / "q.yaml"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err
    assert not (tmp_path / "q.yaml").exists()
