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
    # whether the strategy reads this model's speed should it miss the criterion (else a miss may go untimed)
    speed_if_missed: bool = True


@dataclass(frozen=True)
class Outcome:
    """What a proposal scored; ``objective`` is None when the trial failed."""

    objective: float | None
    violation: float = 0.0
    meets: bool | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    duplicate_of: int | None = None  # the earlier trial that produced the byte-identical model
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
    # (op_types_to_quantize or None, "static" | "dynamic", the steps before the quant step) -> the
    # capability of the model the quant step reads: strategies never read the model file
    capability: Callable[[Sequence[str] | None, str, Sequence[str]], ModelCapability] | None = None
    step_passes: Mapping[str, str] = field(default_factory=dict)  # step id -> pass name
    step_fixed: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # step id -> params the user fixed
    # (point, flow) -> a score per node of the model (higher: quantizing it does more harm).
    sensitivity: Callable[[Point, tuple[str, ...]], Mapping[str, float]] | None = None
    options: StrategyOptions | Mapping[str, Any] = field(default_factory=dict)
    # () -> each node's share (0..1) of the original model's kernel time; empty when unknown
    node_costs: Callable[[], Mapping[str, float]] | None = None
    # (point, flow) -> the point's model latency over the original's, timed side by side (None: unknown).
    latency_ratio: Callable[[Point, tuple[str, ...]], float | None] | None = None
    objective: str = "latency"  # what the run minimises once the criterion holds (latency, size)
    objectives: tuple[str, ...] = ()  # all of them when the run has several (multi-objective samplers get each)
    # (points with their flows, threshold, time budget s) -> each point's latency over the original's,
    # timed side by side until every ratio is surely above or below the threshold (None: failed or out
    # of budget). ``pairs``: (item, reference) companions timed in the same rounds for a paired
    # decision; ``anchor``: a model in budget already, which need not be placed at the margin.
    ceiling_ratios: Callable[..., list[float | None]] | None = None
    timeout_s: float | None = None  # stop.timeout_s: the run's time limit (None: none)
    # (candidate, flow, reference, flow) -> "ratio_median", "faster" (beyond the noise), "same_model",
    # "rounds" of the two trials' models timed side by side; None when unknown
    paired_latency: Callable[[Point, tuple[str, ...], Point, tuple[str, ...]], Mapping[str, Any] | None] | None = None
    # this CPU's int8 dot products saturate (x86 without VNNI/AMX): 7-bit weights are safer
    int8_saturates: bool = False
    # the first proposal is built and evaluated beside the original's evaluation, at no wall time
    evaluates_ahead: bool = False
    # the run's target provider: which of a pass's kernels are slow there (``Pass.faster_twin``)
    provider: str = "CPUExecutionProvider"
    # the criterion's tolerable loss in ``violation`` units (None: unknown): how far a miss is, in budgets
    tolerable_loss: float | None = None


class Strategy(ABC):
    name: str = "strategy"
    # The typed ``search.strategy_options`` (quantune.strategy.options); None: options unchecked.
    Options: ClassVar[type[StrategyOptions] | None] = None
    baseline: Mapping[str, float] = {}  # the original model's figures, once the engine measured them
    # why ``ask`` returned None, when the strategy knows better than "space exhausted"
    finished_reason: str = ""
    # why no candidate it could propose beats the original, measured side by side: the verdict is
    # then "keep the original", even when no trial ran
    original_wins: str = ""

    # ``problem.options`` as this strategy's ``Options`` model (the mapping itself without one)
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
        """Takes a proposal's outcome; may return a note the engine appends to the trial's ``stage``."""

    def first_requests(self) -> tuple[list[Any], float | None, Any, list[Any]]:
        """What the strategy asks first, for the engine to build and evaluate beside the original's:
        (models to build, their time budget, the first model to evaluate, more to evaluate ahead)."""
        return [], None, None, []

    def learned(self) -> dict[str, Any]:
        """What the strategy learned that a report can show; results.json's ``strategy``."""
        return {}

    def answer(self) -> int | None:
        """The trial number of the model the strategy settled on by paired timing, or None. The
        confirmation gives it a tie, so which of near-equal models wins does not follow the noise."""
        return None
