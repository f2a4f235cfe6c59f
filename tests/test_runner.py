"""evaluation.runner: a recurrent model whose state is an input and an output, driven frame by
frame as deployed, for the original and for every candidate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quantune
from conftest import INLINE_EXECUTOR, run_model, save_graph
from quantune.config import load_config
from quantune.engine.trials.setup import build_run

FEATURES, STATE, CLASSES, FRAMES = 4, 6, 3, 40

RUNNER = """
import numpy as np

def run(session, feeds):
    state, outputs = None, []
    for feed in feeds:
        feed = dict(feed)
        if state is not None:
            feed["h"] = state  # the state the model returned for the previous frame
        feed.setdefault("h", np.zeros((1, 6), np.float32))  # data without a state: start from zeros
        y, state = session.run(["y", "h_out"], feed)
        outputs.append({"y": y, "h_out": state})
    return outputs
"""

LOADER = """
import numpy as np

def frames():
    data = np.load("frames.npz")
    return [{{"x": data["x"][i:i + 1], "h": np.zeros((1, {state}), np.float32), "label": data["label"][i:i + 1]}}
            for i in range(len(data["x"]))]

def frames_without_state():
    data = np.load("frames.npz")
    return {{"x": data["x"], "label": data["label"]}}  # a table: batches of 1 row are the frames
"""


def build_recurrent(path: Path, seed: int = 0) -> Path:
    """``h_out = tanh(x Wx + h Wh)``, ``y = h_out Wy``: the state ``h`` is an input and an output."""
    rng = np.random.default_rng(seed)
    arrays = {
        "wx": rng.normal(0, 0.6, (FEATURES, STATE)),
        "wh": rng.normal(0, 0.9, (STATE, STATE)),
        "wy": rng.normal(0, 1.0, (STATE, CLASSES)),
    }
    inits = [numpy_helper.from_array(value.astype(np.float32), name) for name, value in arrays.items()]
    nodes = [
        helper.make_node("MatMul", ["x", "wx"], ["xa"], name="in_proj"),
        helper.make_node("MatMul", ["h", "wh"], ["ha"], name="state_proj"),
        helper.make_node("Add", ["xa", "ha"], ["pre"], name="add"),
        helper.make_node("Tanh", ["pre"], ["h_out"], name="tanh"),
        helper.make_node("MatMul", ["h_out", "wy"], ["y"], name="out_proj"),
    ]
    graph = helper.make_graph(
        nodes,
        "recurrent",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES]),
            helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", STATE]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", CLASSES]),
            helper.make_tensor_value_info("h_out", TensorProto.FLOAT, ["N", STATE]),
        ],
        inits,
    )
    return save_graph(graph, path)


def deployed(model: Path, x: np.ndarray) -> np.ndarray:
    """The model run frame by frame with its state carried: what the runner computes."""
    state = np.zeros((1, STATE), np.float32)
    outputs = []
    for frame in x:
        y, state = run_model(model, {"x": frame[None], "h": state})
        outputs.append(y)
    return np.concatenate(outputs)


@pytest.fixture
def recurrent(tmp_path: Path) -> dict:
    model = build_recurrent(tmp_path / "rnn.onnx")
    x = np.random.default_rng(3).normal(0, 1, (FRAMES, FEATURES)).astype(np.float32)
    labels = np.argmax(deployed(model, x), axis=1).astype(np.int64)  # the truth: the model as deployed
    np.savez(tmp_path / "frames.npz", x=x, label=labels)
    (tmp_path / "loader.py").write_text(
        LOADER.format(state=STATE).replace('"frames.npz"', repr(str(tmp_path / "frames.npz")))
    )
    (tmp_path / "runner.py").write_text(RUNNER)
    config = {
        "model": str(model),
        "data": {"evaluation": str(tmp_path / "loader.py") + ":frames"},
        "evaluation": {"metric": "top1", "latency": {"warmup": 1, "repeats": 3}},
        "criterion": {"type": "absolute", "tolerable_loss": 1.0},
        "passes": [{"name": "dynamic_quant", "params": {"weight_type": {"search": ["int8", "uint8"]}}}],
        "search": {"sampler": "exhaustive"},
        "stop": {"max_trials": 2},
        "cache_dir": str(tmp_path / "cache"),
        **INLINE_EXECUTOR,
    }
    return {"model": model, "x": x, "labels": labels, "config": config, "dir": tmp_path}


def with_runner(recurrent: dict) -> dict:
    config = dict(recurrent["config"])
    config["evaluation"] = {**config["evaluation"], "runner": str(recurrent["dir"] / "runner.py") + ":run"}
    return config


def test_the_runner_scores_the_model_as_deployed_not_teacher_forced(recurrent, tmp_path):
    forced = quantune.tune(recurrent["config"], tmp_path / "forced")
    driven = quantune.tune(with_runner(recurrent), tmp_path / "driven")
    assert driven.baseline["top1"] == 1.0  # labels are the deployed model's own answers
    assert forced.baseline["top1"] < 0.9  # each frame from a zero state: not how the model runs
    for record in driven.trials:  # every candidate is driven by the runner too
        assert record.status == "ok", record.error
        expected = float(
            np.mean(np.argmax(deployed(Path(record.model_path), recurrent["x"]), axis=1) == recurrent["labels"])
        )
        assert record.metrics["top1"] == pytest.approx(expected)
        assert record.metrics["latency_ms"] > 0  # timed through the runner over the latency feed


def test_the_runner_script_is_part_of_the_evaluation_identity(recurrent):
    config = with_runner(recurrent)
    before = build_run(load_config(config)).context
    (recurrent["dir"] / "runner.py").write_text(RUNNER + "\n# edited\n")
    after = build_run(load_config(config)).context
    plain = build_run(load_config(recurrent["config"])).context
    keys = {ctx.eval_key(before.model.sha256) for ctx in (before, after, plain)}
    assert len(keys) == 3


def test_a_runner_may_supply_inputs_the_data_lacks(recurrent, tmp_path):
    config = with_runner(recurrent)
    config["data"] = {"evaluation": str(recurrent["dir"] / "loader.py") + ":frames_without_state", "batch_size": 1}
    result = quantune.tune(config, tmp_path / "run")
    assert result.baseline["top1"] == 1.0
    assert all(r.status == "ok" for r in result.trials)
