"""What the quantune strategy's stages share: one typed state, and the strategy that asks for them. A stage is handed
the stages it calls when it is made: none reaches another's attributes through the strategy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quantune.space import Point
from quantune.strategy.accuracy.common import AccuracyStrategy, Step
from quantune.strategy.accuracy.speed import Variant
from quantune.strategy.base import Outcome
from quantune.strategy.options import QuantuneOptions

Item = tuple[Point, tuple[str, ...]]  # a point and its flow, as the engine builds it
# (the models to build, their time budget, the first model to evaluate, more to evaluate ahead)
FirstRequests = tuple[list[Item], float | None, Item | None, list[Item]]


@dataclass
class Shared:
    """The quantune strategy's run state, shared by its stages."""

    run: AccuracyStrategy  # asks and is told: try_point, complete, known, ctx, problem, baseline
    options: QuantuneOptions
    recover: Callable[[Point, Outcome | None], Step]  # the recovery inside one variant (quantune.py)
    variants: list[Variant] = field(default_factory=list)  # the speed ceilings, in build order
    refined: list[Variant] = field(default_factory=list)  # refined flows' variants: their twin's speed
    decisions: list[str] = field(default_factory=list)  # why variants were kept or dropped, in order
    settled: Point | None = None  # the model the search settled on by paired timing (the answer)
    guess: Variant | None = None  # the first guess's variant (first_guess.py)
    in_play: Variant | None = None  # the variant recovered in: its ceiling bounds every later stage
    recovered: dict[str, Any] | None = None  # what refining recovered, and how (recover.py, targeted.py)
    build_ahead: list[Item] = field(default_factory=list)  # what the engine may build ahead (prebuild.py)
    evaluate_ahead: list[Item] = field(default_factory=list)  # ... and evaluate ahead
