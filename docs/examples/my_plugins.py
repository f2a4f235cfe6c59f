"""Two passes (one of them a quantizer), a sampler, a strategy and a metric, as a plugin file
(``plugins: [my_plugins.py]``).

The worked examples of docs/extending.md: the page includes this file, and tests/test_docs.py
runs searches with them, so the examples stay true to the code.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

import quantune
from quantune.passes import Knobs, PassContext
from quantune.space import Categorical, Point
from quantune.strategy.base import Outcome, Proposal, SearchProblem


# --8<-- [start:pass]
class PruneConfig(quantune.PassConfig):
    sparsity: float = 0.0  # the share of each weight tensor's smallest magnitudes set to zero
    op_types: tuple[str, ...] = ("Conv", "Gemm", "MatMul")


@quantune.register_pass
class MagnitudePrune(quantune.Pass):
    """Sets the smallest weights of Conv/Gemm/MatMul layers to zero."""

    name = "magnitude_prune"
    Config = PruneConfig
    search_space = {"sparsity": Categorical((0.0, 0.25, 0.5))}  # what `search: true` searches
    role = "prepare"  # runs before a quantizer in a flow
    rewrites_weights = True  # passes that read the float weights do not follow it

    def run(self, config: PruneConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        model = onnx.load(str(model_in))
        weights = {n.input[1] for n in model.graph.node if n.op_type in config.op_types and len(n.input) > 1}
        for index, tensor in enumerate(model.graph.initializer):
            if tensor.name in weights and config.sparsity > 0:
                array = numpy_helper.to_array(tensor).copy()
                cut = np.quantile(np.abs(array), config.sparsity)
                array[np.abs(array) < cut] = 0
                model.graph.initializer[index].CopyFrom(numpy_helper.from_array(array, tensor.name))
        onnx.save(model, str(model_out))


# --8<-- [end:pass]


# --8<-- [start:quantizer]
class Int8WeightsConfig(quantune.PassConfig):
    per_channel: bool = False
    keep_float: list[str] = []  # node names left in float


@quantune.register_pass
class Int8Weights(quantune.Pass):
    """int8 weights for MatMul and Gemm, by onnxruntime's dynamic quantizer, under names of its own."""

    name = "int8_weights"
    Config = Int8WeightsConfig
    search_space = {"per_channel": Categorical((False, True))}
    role = "quantize"
    quantizes = "dynamic"  # weights only: each weight it quantizes is a fallback group
    rewrites_weights = True
    min_opset = 11  # DynamicQuantizeLinear
    # its parameters by what they do: the accuracy strategies keep nodes in float through `exclude`
    knobs = Knobs(exclude="keep_float", per_channel="per_channel", screen=("per_channel",))

    def run(self, config: Int8WeightsConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(
            model_in,
            model_out,
            weight_type=QuantType.QInt8,
            per_channel=config.per_channel,
            op_types_to_quantize=["MatMul", "Gemm"],
            nodes_to_exclude=config.keep_float,
        )


# --8<-- [end:quantizer]


# --8<-- [start:sampler]
@quantune.register_sampler("shuffled")
class ShuffledSampler(quantune.Sampler):
    """Every valid point of a finite space once, in an order drawn from the seed."""

    name = "shuffled"

    def bind(self, space: quantune.SearchSpace) -> None:
        super().bind(space)
        self._points = list(space.iterate())  # lazily enumerated; fine for a small space
        random.Random(self.seed).shuffle(self._points)

    def ask(self) -> Point | None:
        return self._points.pop() if self._points else None

    def tell(self, point: Point, feedback: quantune.Feedback) -> None:
        pass  # learns nothing: the order is fixed by the seed


# --8<-- [end:sampler]


# --8<-- [start:strategy]
@quantune.register_strategy("first-met")
class FirstMetStrategy(quantune.Strategy):
    """The configured sampler over the whole space, until a trial meets the criterion."""

    name = "first-met"

    def bind(self, problem: SearchProblem) -> None:
        super().bind(problem)
        self.sampler = problem.make_sampler()  # search.sampler, seeded
        self.sampler.bind(problem.space)
        self.met = False

    def ask(self) -> Proposal | None:
        if self.met:
            self.finished_reason = "a trial met the criterion"  # the run's stop reason quotes it
            return None
        point = self.sampler.ask()
        return None if point is None else Proposal(point, stage="first-met")

    def tell(self, proposal: Proposal, outcome: Outcome) -> str | None:
        self.sampler.tell(proposal.point, outcome.feedback())
        self.met = self.met or bool(outcome.meets)
        return "met: stopping" if outcome.meets else None  # appended to the trial's stage


# --8<-- [end:strategy]


# --8<-- [start:metric]
@quantune.register_metric("macro_f1")
def macro_f1(outputs: dict, data: dict) -> float:
    """The mean over classes of F1, from the first output's arg-max against the labels."""
    predicted = np.argmax(next(iter(outputs.values())), axis=-1).ravel()
    labels = np.asarray(data["label"]).ravel()
    scores = []
    for cls in np.unique(labels):
        tp = np.sum((predicted == cls) & (labels == cls))
        fp, fn = np.sum((predicted == cls) & (labels != cls)), np.sum((predicted != cls) & (labels == cls))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return float(np.mean(scores))


# --8<-- [end:metric]
