"""The memory footprint: ``peak_memory_mb`` of a fresh session, measured in its own process,
the ``memory`` objective, and multi-objective samplers that are told every objective."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quantune
from conftest import save_graph
from quantune.evaluate.backend import LocalBackend
from quantune.search import get_sampler
from quantune.search.directions import sampler_directions


def wide_mlp(path: Path, width: int) -> Path:
    """x[N, width] -> MatMul(width x width) -> Relu -> MatMul(width x 4): weights of about 4 * width^2 bytes."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(0, 0.05, (width, width)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.05, (width, 4)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [w1, w2],
    )
    return save_graph(graph, path)


def test_peak_memory_is_repeatable_and_follows_the_weights(tmp_path: Path) -> None:
    backend = LocalBackend()
    small = wide_mlp(tmp_path / "small.onnx", 64)
    large = wide_mlp(tmp_path / "large.onnx", 2048)  # 16 MB of weights
    feeds = {64: {"x": np.ones((8, 64), np.float32)}, 2048: {"x": np.ones((8, 2048), np.float32)}}
    small_mb = [backend.peak_memory_mb(small, feeds[64], 1) for _ in range(3)]
    large_mb = [backend.peak_memory_mb(large, feeds[2048], 1) for _ in range(3)]
    for runs in (small_mb, large_mb):
        spread = max(runs) - min(runs)
        assert spread <= max(0.05 * statistics.median(runs), 1.0), runs  # fresh processes agree
    assert min(large_mb) > max(small_mb) + 12  # the session holds the 16 MB of weights


def test_memory_is_a_metric_and_an_objective(make_config: Callable[..., dict[str, Any]], tmp_path: Path) -> None:
    config = make_config(objective="memory")
    result = quantune.tune(config, tmp_path / "out")
    assert result.baseline["peak_memory_mb"] > 0
    ok = [t for t in result.trials if t.status == "ok"]
    assert ok and all(t.objective == t.metrics["peak_memory_mb"] > 0 for t in ok)
    assert result.verdict in {"improved", "keep_original", "no_candidate_in_budget"}
    assert ("memory" in result.verdict_reason) or result.verdict == "no_candidate_in_budget"


def test_only_multi_objective_samplers_get_directions() -> None:
    assert sampler_directions("nsga2", ["latency", "memory"]) == {"directions": ("minimize", "minimize")}
    assert sampler_directions("tpe", ["latency", "size", "memory"]) == {"directions": ("minimize",) * 3}
    assert sampler_directions("random", ["latency", "memory"]) == {}
    assert sampler_directions("cmaes", ["latency", "memory"]) == {}
    assert sampler_directions("nsga2", ["latency"]) == {}


@pytest.fixture
def recording_nsga2(tmp_path: Path) -> str:
    """A plugin: NSGA-II that keeps every feedback it is told (the real Optuna sampler underneath)."""
    plugin = tmp_path / "recording.py"
    plugin.write_text(
        "import quantune\n"
        "from quantune.search.optuna_sampler import NSGAIISampler\n\n"
        "@quantune.register_sampler('recording-nsga2')\n"
        "class Recording(NSGAIISampler):\n"
        "    told = []\n"
        "    made = []\n\n"
        "    def bind(self, space):\n"
        "        super().bind(space)\n"
        "        Recording.made.append(self.directions)\n\n"
        "    def tell(self, point, feedback):\n"
        "        Recording.told.append(feedback.values())\n"
        "        super().tell(point, feedback)\n"
    )
    return str(plugin)


def test_nsga2_is_told_every_objective(
    make_config: Callable[..., dict[str, Any]], tmp_path: Path, recording_nsga2: str
) -> None:
    config = make_config(
        passes=[{"name": "static_quant", "search": True}],
        objectives=["latency", "memory"],
        search={"sampler": "recording-nsga2", "seed": 0},
        stop={"max_trials": 5},
        plugins=[recording_nsga2],
    )
    result = quantune.tune(config, tmp_path / "out")
    sampler = get_sampler("recording-nsga2")
    assert sampler.made == [("minimize", "minimize")]
    told = [values for values in sampler.told if values is not None]
    ok = sorted((t for t in result.trials if t.status == "ok"), key=lambda t: t.told_index)
    assert len(told) == len(ok) >= 2
    for values, record in zip(told, ok, strict=True):
        # the sampler was told the search's figure (a re-timed model's is latency_search_ms after the end)
        searched = record.metrics.get("latency_search_ms", record.metrics["latency_ms"])
        assert values == (searched, record.metrics["peak_memory_mb"])
    assert result.pareto_front  # reported over both objectives
