"""The strategy interface: ``ask`` for a proposal, ``tell`` its outcome.

A proposal is a point (values for ``<step>.<param>``) plus the steps to run; the strategy
never touches files. ``ask`` may answer :data:`WAIT` when it cannot propose more until
running trials finish (a stage boundary), or ``None`` when it is done.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from quantune.search import Feedback, Sampler
from quantune.space import Point, SearchSpace
from quantune.strategy.options import StrategyOptions, options_as

if TYPE_CHECKING:
    from quantune.graph.capability import ModelCapability


@dataclass(frozen=True)
class Proposal:
    point: Point
    flow: tuple[str, ...] | None = None  # None: the flow the point names (or the only flow)
    stage: str = ""
    # whether the strategy reads the speed of this proposal's model should it miss the criterion; when it
    # does not, the engine leaves a miss untimed unless it may be the closest miss (Trial.untimed_if_missed)
    speed_if_missed: bool = True


@dataclass(frozen=True)
class Outcome:
    """What a proposal scored; ``objective`` is None when the trial failed."""

    objective: float | None
    violation: float = 0.0
    meets: bool | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    duplicate_of: int | None = None  # the earlier trial that produced the byte-identical model
    # every objective's value when the run has several (``objectives:``), in the declared order
    objectives: tuple[float, ...] | None = None
    number: int | None = None  # the trial that scored it (stop reasons name it)

    @property
    def failed(self) -> bool:
        return self.objective is None

    def feedback(self) -> Feedback:
        if self.objective is None:
            return Feedback(None, self.violation)
        return Feedback(self.objective, self.violation, objectives=self.objectives)


class _Wait:
    def __repr__(self) -> str:
        return "WAIT"


WAIT: Any = _Wait()


@dataclass(frozen=True)
class SearchProblem:
    """What a strategy may know: the spaces and flows, never the models."""

    space: SearchSpace
    flows: Mapping[str, tuple[str, ...]]
    subspace: Callable[[list[str], Mapping[str, Any]], SearchSpace]
    make_sampler: Callable[[], Sampler]
    max_trials: int | None = None
    groups: list[list[str]] | None = None
    trials_per_group: int | None = None
    keep_best: int = 3
    # For accuracy-driven strategies (per-operator precision); empty when the engine does not fill them.
    # (op_types_to_quantize or None, "static" | "dynamic", the flow's steps before the quant step)
    # -> the quantization capability (groups of operators) of the model the quant step reads;
    # given by the engine, so strategies never read the model file
    capability: Callable[[Sequence[str] | None, str, Sequence[str]], ModelCapability] | None = None
    step_passes: Mapping[str, str] = field(default_factory=dict)  # step id -> pass name
    step_fixed: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # step id -> params the user fixed
    # (point, flow) -> a score per node of the model (higher: quantizing it does more harm).
    sensitivity: Callable[[Point, tuple[str, ...]], Mapping[str, float]] | None = None
    # the strategy's options: its validated model (engine/run/problem.py), or a plain mapping (unchecked)
    options: StrategyOptions | Mapping[str, Any] = field(default_factory=dict)
    # () -> each node's share (0..1) of the original model's kernel time (onnxruntime's profiler),
    # measured once when first asked; empty when unknown.
    node_costs: Callable[[], Mapping[str, float]] | None = None
    # (point, flow) -> the point's model latency over the original's, timed side by side (None: unknown).
    latency_ratio: Callable[[Point, tuple[str, ...]], float | None] | None = None
    objective: str = "latency"  # what the run minimises once the criterion holds (latency, size)
    objectives: tuple[str, ...] = ()  # all of them when the run has several (multi-objective samplers get each)
    # (points with their flows, threshold, time budget s) -> each point's latency over the original's,
    # all timed in one side-by-side session that stops once every ratio is surely above or below
    # the threshold; None where the point's model failed or the budget ran out before it was built.
    # Keyword ``pairs``: (item, reference item) indices of companions timed in the same rounds for a
    # paired decision against the reference (as ``paired_latency`` answers it, which then reads it back).
    # Keyword ``anchor``: the item of a model in budget already; the rounds need not place it at the margin.
    ceiling_ratios: Callable[..., list[float | None]] | None = None
    timeout_s: float | None = None  # stop.timeout_s: the run's time limit (None: none)
    # (candidate, its flow, reference, its flow) -> the candidate's model latency over the reference's,
    # timed side by side: "ratio_median", "faster" (beyond the noise), "same_model" (byte-identical:
    # not timed), "rounds"; None when unknown. Trials' models only (their passes ran).
    paired_latency: Callable[[Point, tuple[str, ...], Point, tuple[str, ...]], Mapping[str, Any] | None] | None = None
    # this CPU's int8 dot products saturate (x86 without VNNI/AMX): 7-bit weights are safer
    int8_saturates: bool = False
    # the engine builds and evaluates a strategy's first proposal beside the original's evaluation
    # (engine/measure/prebuild.py): a first guess there costs no wall time before the speed ceilings
    evaluates_ahead: bool = False
    # the execution provider the run's models are for (``target.provider``; the provider axis's points
    # name their own): which of a pass's kernels are slow there (``Pass.faster_twin``)
    provider: str = "CPUExecutionProvider"
    # the criterion's tolerable loss, in the units of an outcome's ``violation`` (None: not known):
    # how far a miss is, in budgets (the recover stage tries refining passes on close misses only)
    tolerable_loss: float | None = None


class Strategy(ABC):
    name: str = "strategy"
    # The typed ``search.strategy_options`` (quantune.strategy.options); None: options unchecked.
    Options: ClassVar[type[StrategyOptions] | None] = None
    baseline: Mapping[str, float] = {}  # the original model's figures, once the engine measured them
    # why ``ask`` returned None, when the strategy knows better than "space exhausted" (the
    # engine's stop reason quotes it)
    finished_reason: str = ""
    # set when the strategy measured, side by side, that no candidate it could propose beats the
    # original (every quantized variant's speed ceiling slower): then the verdict is "keep the
    # original" with this reason, even when no trial ran
    original_wins: str = ""

    # ``problem.options`` as this strategy's ``Options`` model (the mapping itself without one):
    # subclasses read their options' typed fields here, defaults filled by the model
    options: Any = None

    def bind(self, problem: SearchProblem) -> None:
        self.problem = problem
        self.options = problem.options if self.Options is None else options_as(problem.options, self.Options, self.name)

    def observe_baseline(self, metrics: Mapping[str, float]) -> None:
        """The original model's figures (latency, metric), measured before the first ``ask``."""
        self.baseline = dict(metrics)

    @abstractmethod
    def ask(self) -> Proposal | None: ...

    @abstractmethod
    def tell(self, proposal: Proposal, outcome: Outcome) -> str | None:
        """Takes a proposal's outcome; may return a note on what it decided from it, which the
        engine appends to the trial's ``stage`` (e.g. why a flow was dropped)."""

    def first_requests(self) -> tuple[list[Any], float | None, Any, list[Any]]:
        """What the strategy asks first, declared before it asks, for the engine to build and evaluate
        beside the original's evaluation (engine/measure/prebuild.py): (the models to build, their time budget,
        the first model to evaluate, more to evaluate ahead); nothing by default."""
        return [], None, None, []

    def learned(self) -> dict[str, Any]:
        """What the strategy learned that a report can show (e.g. each fallback group's
        sensitivity score); written to results.json as ``strategy``. Empty by default."""
        return {}

    def answer(self) -> int | None:
        """The trial number of the model the strategy itself settled on by paired timing (the
        quantune strategy's model at the speed ceiling, or its latency stage's incumbent), or None
        (the default: the confirmation then picks by its own rule). The confirmation re-times it
        beside the fastest by search-time figures and gives it a tie (engine/measure/confirm.py): which of
        several near-equal models wins must not follow the search-time noise."""
        return None
