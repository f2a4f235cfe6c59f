"""The Pass contract.

A pass turns one model file into another. It declares:

* ``Config``: a pydantic model of its parameters, with defaults (what runs when nothing is
  searched) and validators (what onnxruntime cannot do, so such points are never run);
* ``search_space``: its default search values, used when a config says ``search: true``;
* ``needs_calibration``: whether it reads calibration data (which then enters its cache key);
* ``providers`` / ``provider_rules``: what a target execution provider can run, so the space
  for a target holds only what runs there;
* ``accepts``: which outputs of earlier passes it can take as input, so flows that cannot
  work (quantizing a graph with layout-specific fused operators) are never tried;
* ``min_opset`` / ``supports``: the opset its whole space needs (preparation raises the model
  to it) and, from facts about the prepared model, which points cannot work on it (a
  per-channel QDQ point on a model whose opset could not be raised), so they are pruned.

And its *traits* (scikit-learn's estimator tags): what the rest of the house needs to know about
it (``providers`` above is one), read from the class instead of from lists of pass names kept elsewhere, so a new pass is one
file and its registration:

* ``role``: what it does in a flow (``optimize``, ``prepare``, ``quantize``, ``recover``,
  ``convert``, ``tune``, ``provider``: the step that says where the model runs); recipes (``prepare``/``recover``) are what the accuracy strategies
  search before any fallback;
* ``quantizes``: ``"static"`` (calibrated activation ranges: the accuracy strategies fall back
  ops, int16 too) or ``"dynamic"`` (weights only: each weight it touches is a group), or None;
  a quantizing pass names the parameter that excludes nodes in ``knobs`` (how fallback is written);
* ``leaves_quantized``: the op types its output computes quantized, so a model it wrote is not
  taken for "quantizes nothing": a kernel op (``MatMulNBits``), or a float compute op whose
  weight comes from a ``DequantizeLinear`` (``MatMul``: weight-only QDQ that onnxruntime fuses);
* ``rewrites_weights``: its output's weights are no longer float32 initializers (quantized or
  cast), so passes that read float weights cannot follow it;
* ``restructuring``: its output has other nodes than its input (fused, replaced), so a later
  quantizer's groups come from its output;
* ``auto_place``: where ``flows: auto`` places it (``quantize``: alone and after fusion;
  ``fuse``: alone and before the quantizers and weight passes; ``weights``: alone, after fusion
  and before the dynamic quantizers; ``half``: alone and after fusion, when size is an
  objective; ``refine``: after each static quantizer), or None: flows are written by hand;
* ``graph_params``: the parameters that change the executed graph (op and tensor types, which
  nodes are quantized, the Q/DQ layout), so they can change speed; None: every parameter may.
  The quantune strategy's latency stage tries only these;
* ``recover_cost``: for a ``recover`` pass, how costly it is (the recover stage tries the
  cheapest refining flow first);
* ``knobs``: its parameters by what they do (:class:`Knobs`: which excludes nodes, which restricts
  op types, which picks the format and the weight type, which axes its speed ceilings span --
  activation type and format, say), so the strategies and probes move any quantizer unnamed;
  ``fastest`` / ``ceiling_values``: which of those values run fastest, and which give the same
  model on a given graph;
* ``faster_twin``: for a config whose kernels are known slow on a provider, the parameter values
  that give the same kind of model on the runtime's fast path (the speed ceilings skip the slow
  one when its twin is among them: it could only be built and timed to be dropped).

Passes know nothing about search or caching; the engine hands them paths and a context.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from quantune.data import Dataset
from quantune.passes.timing import PassTiming
from quantune.space import Param

Role = Literal["optimize", "prepare", "quantize", "recover", "convert", "tune", "provider", "other"]
RECIPE_ROLES = frozenset({"prepare", "recover"})  # range-fixing recipes around a quantizer


@dataclass(frozen=True)
class Knobs:
    """A pass's parameters by what they do (None: it has no such parameter): the strategies and
    probes read these instead of parameter names, so a quantizer whose knobs are named otherwise
    still gets speed ceilings, fallback and recovery."""

    exclude: str | None = None  # node names kept in float: how fallback is written
    overrides: str | None = None  # per-tensor activation types (an int16 fallback)
    op_types: str | None = None  # restricts the op types quantized
    layout: str | None = None  # the quant format; ``qdq``: its value that keeps every tensor visible
    qdq: object = None
    weights: str | None = None  # the weight type
    per_channel: str | None = None  # per-channel weight scales (the accuracy defaults turn them on)
    narrow: str | None = None  # 7-bit weights, where the CPU's int8 dot products saturate
    channel_nodes: str | None = None  # per-channel weights on the named nodes only
    samples: str | None = None  # calibration rows
    calibration: tuple[str, ...] = ()  # what decides the activation ranges
    screen: tuple[str, ...] = ()  # what moves accuracy more than speed, screened before any fallback
    ceilings: tuple[str, ...] = ()  # the axes of the speed ceilings' grid, the outer first
    speed_class: tuple[str, ...] = ()  # what decides a variant's speed (held while accuracy is recovered)
    built_last: dict[str, object] = field(default_factory=dict)  # ceiling values known slow: built last


class PassConfig(BaseModel):
    """Base of every pass config: unknown parameters are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class PassContext:
    """What a pass may need beyond its input model: calibration data, a scratch folder, and a
    folder for its own reusable intermediate results (e.g. calibration ranges)."""

    calibration: Dataset | None
    input_names: list[str]
    batch_size: int
    work_dir: Path
    model_sha256: str = ""
    cache_dir: Path | None = None
    timing: PassTiming | None = None  # the run's timed feed, for passes that choose by timing (needs_timing)


class Pass(ABC):
    """One model transformation; subclasses register with :func:`register_pass`."""

    name: ClassVar[str]
    Config: ClassVar[type[PassConfig]]
    search_space: ClassVar[dict[str, Param]] = {}
    needs_calibration: ClassVar[bool] = False
    # Execution providers whose kernels can run this pass's output (None: any provider).
    providers: ClassVar[tuple[str, ...] | None] = None
    # Per provider, the parameter values that provider supports; other values are pruned.
    provider_rules: ClassVar[dict[str, dict[str, tuple[object, ...]]]] = {}
    # Bump when the output for the same input and config changes, so old cache entries are not reused.
    version: ClassVar[int] = 1
    # The default-domain opset every value of this pass's space works at; model preparation
    # raises a lower opset to the highest ``min_opset`` of the run's passes (0: no need).
    min_opset: ClassVar[int] = 0
    # Whether the pass times models (``PassContext.timing``); the timed feed and latency settings then enter its cache key.
    needs_timing: ClassVar[bool] = False
    # What it cannot follow or run on, in words: the message when every point of a space is pruned.
    limits: ClassVar[str] = ""
    # Whether the pass must end its flows (its output is partly beside the model, which later passes do not read).
    last_in_flow: ClassVar[bool] = False

    # Traits (see the module docstring): read by the engine, the strategies and the other passes.
    role: ClassVar[Role] = "other"
    quantizes: ClassVar[Literal["static", "dynamic"] | None] = None
    leaves_quantized: ClassVar[frozenset[str]] = frozenset()
    rewrites_weights: ClassVar[bool] = False
    restructuring: ClassVar[bool] = False
    graph_params: ClassVar[frozenset[str] | None] = None
    recover_cost: ClassVar[int] = 0  # a refining pass's cost rank (1: one pass over the data; 2: a fit per layer)
    auto_place: ClassVar[Literal["quantize", "fuse", "weights", "half", "refine"] | None] = None
    knobs: ClassVar[Knobs] = Knobs()

    @classmethod
    def fastest(cls, op_types: frozenset[str]) -> dict[str, Any]:
        """The values of its ceiling axes whose kernels run fastest on a model of ``op_types``
        (the likeliest ceiling of a dynamic flow); empty when nothing is known."""
        return {}

    @classmethod
    def ceiling_values(cls, param: str, values: list[Any], op_types: frozenset[str]) -> list[Any]:
        """The values of ceiling axis ``param`` worth timing on a model of ``op_types``: all of them
        unless some give the same model as another there."""
        return values

    @classmethod
    def needs_symbolic_shapes(cls, values: Mapping[str, Any]) -> bool:
        """Whether a run with these parameter ``values`` (by name, the pass's own) uses onnxruntime's
        symbolic shape inference, whose sympy is slow to load: a stage worker then loads it
        in a thread as it starts (prepare.shapes.load_in_background), beside its set-up."""
        return False

    @classmethod
    def keeps_graph(cls, config: Any) -> bool:
        """Whether its output with ``config`` has its input's nodes and weights (so facts read from
        the input still describe it)."""
        return False

    @classmethod
    def faster_twin(
        cls, config: Mapping[str, Any], provider: str, op_types: frozenset[str]
    ) -> tuple[dict[str, Any], str] | None:
        """(the parameter values that make ``config``'s model run on ``provider``'s fast kernels, why),
        or None when nothing is known. ``op_types``: the op types the model would quantize. Known
        facts of the runtime only -- a speed learned on one model is a measurement, not a trait."""
        return None

    @classmethod
    def accepts(cls, config: PassConfig, upstream: list[tuple[str, PassConfig]]) -> bool:
        """Whether this pass, with ``config``, can take the output of ``upstream`` (pass name and
        config of each earlier step of the flow, in order). Points where it cannot are pruned."""
        return True

    @classmethod
    def supports(cls, config: PassConfig, facts: Mapping[str, Any], upstream: list[tuple[str, PassConfig]]) -> bool:
        """Whether ``config`` can work on the model the flow starts from, described by ``facts``
        (see :mod:`quantune.prepare.facts`; empty when unknown), after ``upstream``. Points where
        it cannot are pruned before they run."""
        return True

    @abstractmethod
    def run(self, config: PassConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        """Reads ``model_in`` and writes the transformed model to ``model_out``."""
