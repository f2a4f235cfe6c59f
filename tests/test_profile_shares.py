"""Node costs for the orders a search takes (prune, op types added back, bisection): each kind's
measured time split by work, so two near-equal convs keep one order from one profile to the next."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conftest import save_graph
from quantune.evaluate.profile import node_time_shares, node_work, spread_by_work


def _model(path: Path) -> Path:
    """conv_a (8->8, 3x3), conv_b (8->8, 3x3, same MACs), conv_c (8->16, 3x3: twice), dw (depthwise)."""
    rng = np.random.default_rng(0)

    def weight(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["ra"], name="relu_a"),
        helper.make_node("Conv", ["ra", "wb"], ["b"], name="conv_b", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["b", "wd"], ["d"], name="dw", pads=[1, 1, 1, 1], group=8),
        helper.make_node("Conv", ["d", "wc"], ["y"], name="conv_c", pads=[1, 1, 1, 1]),
    ]
    inits = [
        weight("wa", (8, 8, 3, 3)),
        weight("wb", (8, 8, 3, 3)),
        weight("wd", (8, 1, 3, 3)),
        weight("wc", (16, 8, 3, 3)),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])],
        inits,
    )
    return save_graph(graph, path)


def test_a_kinds_time_is_split_by_work_and_shares_sum_to_one(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx")
    feeds = {"x": np.ones((1, 8, 16, 16), np.float32)}
    shares = node_time_shares(model, feeds, runs=3)
    assert abs(sum(shares.values()) - 1.0) < 1e-9
    assert shares["conv_a"] == shares["conv_b"]  # the same work: one cost, whatever each timing said
    assert abs(shares["conv_c"] / shares["conv_a"] - 2.0) < 1e-9  # twice the MACs
    again = node_time_shares(model, feeds, runs=3)
    assert again["conv_a"] == again["conv_b"] and abs(again["conv_c"] / again["conv_a"] - 2.0) < 1e-9


def test_depthwise_convs_are_a_kind_of_their_own_and_unknown_work_keeps_the_timings() -> None:
    dense = {
        "op_name": "Conv",
        "input_type_shape": [{"float": [1, 8, 4, 4]}, {"float": [8, 8, 3, 3]}],
        "output_type_shape": [{"float": [1, 8, 4, 4]}],
    }
    depthwise = {
        "op_name": "Conv",
        "input_type_shape": [{"float": [1, 8, 4, 4]}, {"float": [8, 1, 3, 3]}],
        "output_type_shape": [{"float": [1, 8, 4, 4]}],
    }
    first = {
        "op_name": "Conv",
        "input_type_shape": [{"float": [1, 1, 4, 4]}, {"float": [8, 1, 3, 3]}],
        "output_type_shape": [{"float": [1, 8, 4, 4]}],
    }
    assert node_work(dense) == ("Conv", 128 * 72)
    assert node_work(depthwise) == ("Conv (depthwise)", 128 * 9)
    assert node_work(first)[0] == "Conv"  # one input channel: a dense conv, not a depthwise one
    assert node_work({"op_name": "Add"})[1] == 0  # no shapes: unknown
    shares = spread_by_work({"a": 3.0, "b": 1.0}, {"a": ("Add", 0.0), "b": ("Add", 5.0)})
    assert shares == {"a": 0.75, "b": 0.25}  # unknown work: the nodes' own timings
