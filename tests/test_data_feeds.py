"""Data of any shape: feeds of different widths through a whole run, ragged calibration batches
for every calibration method, separate batch sizes, and the timed feed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quantune
from conftest import INLINE_EXECUTOR, build_cnn, cnn_inputs, save_graph
from quantune.config import load_config
from quantune.data import CalibrationReader, Dataset, load_dataset
from quantune.engine.trials.setup import build_run
from quantune.errors import QuantuneError
from quantune.passes.base import PassContext
from quantune.passes.onnx.static_quant import StaticQuantization, StaticQuantizationConfig

WIDTHS = (5, 9, 12, 7)
METHODS = ("MinMax", "Entropy", "Percentile", "Distribution")


def build_wide_cnn(path: Path, seed: int = 0) -> Path:
    """Conv -> Relu -> Conv over ``input[N, 1, 8, W]`` (W free): output ``map[N, 4, 8, W]`` follows
    the input's width (feeds' outputs do not stack), ``logits[N, 4]`` does."""
    rng = np.random.default_rng(seed)
    arrays = {
        "w1": rng.normal(0, 0.5, (8, 1, 3, 3)),
        "b1": rng.normal(0, 0.1, (8,)),
        "w2": rng.normal(0, 0.3, (4, 8, 3, 3)),
        "b2": rng.normal(0, 0.1, (4,)),
    }
    inits = [numpy_helper.from_array(value.astype(np.float32), name) for name, value in arrays.items()]
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["map"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["map"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["logits"], name="flatten"),
    ]
    graph = helper.make_graph(
        nodes,
        "wide_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, "W"])],
        [
            helper.make_tensor_value_info("map", TensorProto.FLOAT, ["N", 4, 8, "W"]),
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4]),
        ],
        inits,
    )
    return save_graph(graph, path)


def feeds(seed: int, rows: int = 2) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"input": rng.normal(0, 1, (rows, 1, 8, w)).astype(np.float32)} for w in WIDTHS]


LOADER = """
import numpy as np
WIDTHS = {widths}

def _feeds(seed):
    rng = np.random.default_rng(seed)
    return [{{"input": rng.normal(0, 1, (2, 1, 8, w)).astype(np.float32)}} for w in WIDTHS]

def calibration():
    return _feeds(1)

def evaluation():
    return iter(_feeds(2))  # any iterable of dicts is a list of feeds

def score(outputs, data):
    # feeds of different widths: one array per feed, for outputs and for data alike
    assert isinstance(outputs["map"], list) and isinstance(data["input"], list), "expected per-feed lists"
    assert [m.shape[-1] for m in outputs["map"]] == [x.shape[-1] for x in data["input"]]
    assert isinstance(outputs["logits"], np.ndarray) and len(outputs["logits"]) == 2 * len(WIDTHS)
    return float(np.mean([np.mean(m > 0) for m in outputs["map"]]))
"""


@pytest.fixture
def wide(tmp_path: Path) -> dict[str, Path]:
    model = build_wide_cnn(tmp_path / "wide.onnx")
    (tmp_path / "loader.py").write_text(LOADER.format(widths=WIDTHS))
    return {"model": model, "dir": tmp_path}


def wide_config(wide: dict[str, Path], **evaluation) -> dict:
    return {
        "model": str(wide["model"]),
        "data": {
            "calibration": str(wide["dir"] / "loader.py") + ":calibration",
            "evaluation": str(wide["dir"] / "loader.py") + ":evaluation",
        },
        "evaluation": {"metric": "cosine", "latency": {"warmup": 1, "repeats": 3}, **evaluation},
        "criterion": {"type": "absolute", "tolerable_loss": 0.5},
        "passes": [{"name": "static_quant", "params": {"calibrate_method": {"search": list(METHODS)}}}],
        "search": {"sampler": "exhaustive"},
        "stop": {"max_trials": 4},
        "cache_dir": str(wide["dir"] / "cache"),
        **INLINE_EXECUTOR,
    }


def test_a_loader_returning_dicts_gives_feeds_run_as_they_are(wide):
    dataset = load_dataset("loader.py:evaluation", field_name="data.evaluation", base_dir=wide["dir"])
    assert not dataset.is_table
    # each feed whole, whatever the batch size: never concatenated or re-sliced
    assert [b["input"].shape for b in dataset.batches(["input"], batch_size=1)] == [(2, 1, 8, w) for w in WIDTHS]
    assert len(dataset) == 2 * len(WIDTHS)
    assert isinstance(dataset.column("input"), list)
    # the fingerprint covers every feed's content
    changed = feeds(2)
    changed[-1]["input"][0, 0, 0, 0] += 1.0
    assert Dataset({}, "x", tuple(changed)).fingerprint != Dataset({}, "x", tuple(feeds(2))).fingerprint
    assert Dataset({}, "x", tuple(feeds(2))).fingerprint == dataset.fingerprint


def test_tune_on_feeds_of_different_widths_with_every_calibration_method(wide, tmp_path):
    result = quantune.tune(wide_config(wide), tmp_path / "run")
    assert result.baseline["cosine"] == pytest.approx(1.0)
    assert sorted(r.params["static_quant.calibrate_method"] for r in result.trials) == sorted(METHODS)
    failed = [(r.params, r.error) for r in result.trials if r.status != "ok"]
    assert not failed
    for record in result.trials:  # each candidate compared feed by feed with the original
        assert 0.5 < record.metrics["cosine"] <= 1.0 + 1e-6


def test_a_custom_metric_gets_per_feed_lists_when_outputs_do_not_stack(wide, tmp_path):
    config = wide_config(wide, metric=str(wide["dir"] / "loader.py") + ":score")
    config["criterion"] = {"type": "absolute", "tolerable_loss": 0.2, "higher_is_better": True}
    config["stop"] = {"max_trials": 1}
    result = quantune.tune(config, tmp_path / "run")
    assert 0.0 < result.baseline[config["evaluation"]["metric"]] < 1.0
    assert all(r.status == "ok" for r in result.trials), [r.error for r in result.trials]


@pytest.mark.parametrize("method", METHODS)
def test_a_ragged_last_calibration_batch_works_for_every_method(tmp_path, method):
    model = build_cnn(tmp_path / "cnn.onnx")
    calibration = Dataset({"input": cnn_inputs(80, seed=1)}, "data.calibration")
    reader = CalibrationReader(calibration, ["input"], 32, None)
    assert [len(b["input"]) for b in iter(reader.get_next, None)] == [32, 32, 16]
    out = tmp_path / f"{method}.onnx"
    context = PassContext(calibration, ["input"], 32, tmp_path)
    StaticQuantization().run(StaticQuantizationConfig(calibrate_method=method), model, out, context)
    assert out.is_file()


def test_batch_sizes_are_separate_for_calibration_evaluation_and_timing(make_config, tmp_path):
    config = make_config(
        passes=[{"name": "static_quant", "params": {"calibrate_method": "Entropy"}}],
        data={**make_config()["data"], "calibration_batch_size": 24, "evaluation_batch_size": 20},
    )
    config["evaluation"]["latency"]["batch_size"] = 3
    parts = build_run(load_config(config))
    assert parts.context.batch_size == 24  # what every calibrating pass is given (64 rows: 24, 24, 16)
    assert [len(feed["input"]) for feed in parts.context.evaluator.feeds] == [20, 20, 8]
    assert len(parts.context.evaluator._latency_feeds["input"]) == 3
    result = quantune.tune(config, tmp_path / "run")
    assert [r.status for r in result.trials] == ["ok"]


def test_the_timed_feed_is_chosen_by_index(wide, tmp_path):
    parts = build_run(load_config(wide_config(wide, latency={"feed": 2, "warmup": 1, "repeats": 3})))
    assert parts.context.evaluator._latency_feeds["input"].shape == (2, 1, 8, WIDTHS[2])
    default = build_run(load_config(wide_config(wide)))
    assert default.context.evaluator._latency_feeds["input"].shape == (2, 1, 8, WIDTHS[0])
    with pytest.raises(QuantuneError, match=r"evaluation.latency.feed: 9 is past the last evaluation feed"):
        build_run(load_config(wide_config(wide, latency={"feed": 9})))
