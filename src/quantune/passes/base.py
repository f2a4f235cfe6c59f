"""The Pass contract: a pass turns one model file into another and declares what it needs.

``Config`` (pydantic: defaults, and validators rejecting what onnxruntime cannot do),
``search_space`` (default search values), ``needs_calibration``, ``providers`` /
``provider_rules`` (what a target provider can run), ``accepts`` (which earlier outputs it can
take), ``min_opset`` / ``supports`` (which points cannot work on the prepared model).

Its *traits* (scikit-learn's estimator tags) are read from the class instead of from lists of
pass names kept elsewhere, so a new pass is one file and its registration:

* ``role``: its step in a flow; recipes (``prepare``/``recover``) are searched before fallback;
* ``quantizes``: ``"static"`` (calibrated activations: fallback by op, int16 too), ``"dynamic"``
  (weights only: each weight is a group), or None;
* ``leaves_quantized``: op types its output computes quantized (``MatMulNBits``, or a ``MatMul``
  fed by a ``DequantizeLinear``), so its model is not taken for "quantizes nothing";
* ``rewrites_weights``: its weights are no longer float32, so float-weight passes cannot follow;
* ``restructuring``: its output has other nodes, so a later quantizer's groups come from it;
* ``auto_place``: where ``flows: auto`` places it, or None: flows are written by hand;
* ``graph_params``: the parameters that change the executed graph, so can change speed (None: all);
* ``recover_cost``: a ``recover`` pass's cost rank (the cheapest refining flow is tried first);
* ``knobs``: its parameters by what they do (:class:`Knobs`), so strategies move any quantizer;
* ``faster_twin``: the values that give the same kind of model on the provider's fast kernels.

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
    """A pass's parameters by what they do (None: it has none), read instead of parameter names."""

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
    """What a pass may need beyond its input model."""

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
    providers: ClassVar[tuple[str, ...] | None] = None
    provider_rules: ClassVar[dict[str, dict[str, tuple[object, ...]]]] = {}
    # Bump when the output for the same input and config changes (old cache entries are stale).
    version: ClassVar[int] = 1
    # Preparation raises the model to the highest ``min_opset`` of the run's passes.
    min_opset: ClassVar[int] = 0
    # Whether it times models: the timed feed and latency settings then enter its cache key.
    needs_timing: ClassVar[bool] = False
    # The message when every point of a space is pruned.
    limits: ClassVar[str] = ""
    # Whether it must end its flows (later passes do not read what it writes beside the model).
    last_in_flow: ClassVar[bool] = False

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
        """The ceiling-axis values whose kernels run fastest on ``op_types``; empty when unknown."""
        return {}

    @classmethod
    def ceiling_values(cls, param: str, values: list[Any], op_types: frozenset[str]) -> list[Any]:
        """The values of ceiling axis ``param`` that give distinct models on ``op_types``."""
        return values

    @classmethod
    def needs_symbolic_shapes(cls, values: Mapping[str, Any]) -> bool:
        """Whether ``values`` use symbolic shape inference, whose sympy a worker then preloads."""
        return False

    @classmethod
    def keeps_graph(cls, config: Any) -> bool:
        """Whether its output keeps its input's nodes and weights (facts of the input still hold)."""
        return False

    @classmethod
    def faster_twin(
        cls, config: Mapping[str, Any], provider: str, op_types: frozenset[str]
    ) -> tuple[dict[str, Any], str] | None:
        """(values that put ``config``'s model on ``provider``'s fast kernels, why), or None: known
        facts of the runtime only -- a speed learned on one model is a measurement, not a trait."""
        return None

    @classmethod
    def accepts(cls, config: PassConfig, upstream: list[tuple[str, PassConfig]]) -> bool:
        """Whether it can take the output of ``upstream`` (the earlier (name, config) steps)."""
        return True

    @classmethod
    def supports(cls, config: PassConfig, facts: Mapping[str, Any], upstream: list[tuple[str, PassConfig]]) -> bool:
        """Whether ``config`` can work after ``upstream`` on a model with ``facts`` (empty: unknown)."""
        return True

    @abstractmethod
    def run(self, config: PassConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        """Reads ``model_in`` and writes the transformed model to ``model_out``."""
