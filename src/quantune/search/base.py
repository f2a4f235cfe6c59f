"""The sampler interface: ``ask`` for the next point, ``tell`` what it scored.

A sampler never touches files or models. It sees a :class:`~quantune.space.SearchSpace`,
proposes points, and learns from :class:`Feedback`. The engine decides what a score is.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

from quantune.space import Point, SearchSpace


@dataclass(frozen=True)
class Feedback:
    """What one point scored.

    ``objective`` is the value to minimise (``None``: failed); ``violation`` how far the point is
    from the accuracy criterion (0: met), which constrained samplers steer by. ``objectives``
    carries one value per direction for multi-objective samplers.

    >>> Feedback(3.1, objectives=(3.1, 167_987)).values()
    (3.1, 167987.0)
    """

    objective: float | None
    violation: float = 0.0
    objectives: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.objectives is not None:
            values = tuple(float(value) for value in self.objectives)
            if not values:
                raise ValueError("Feedback.objectives: give at least one value, or None")
            object.__setattr__(self, "objectives", values)

    @property
    def failed(self) -> bool:
        return self.objective is None and self.objectives is None

    def values(self) -> tuple[float, ...] | None:
        """``objectives`` when given, else ``(objective,)``; ``None`` if failed (a NaN too: no sampler ranks it)."""
        if self.objectives is not None:
            values = self.objectives
        elif self.objective is not None:
            values = (float(self.objective),)
        else:
            return None
        return None if any(math.isnan(value) for value in values) else values


class Sampler(ABC):
    """Suggests points of a search space. Subclasses register with :func:`register_sampler`.

    Same space + same seed + same feedback => same points in the same order.
    """

    name: str = "sampler"

    def __init__(self, seed: int | None = 0) -> None:
        self.seed = seed
        self.space: SearchSpace | None = None

    def bind(self, space: SearchSpace) -> None:
        """Attaches the space; called once by the engine before the first ``ask``."""
        self.space = space

    @abstractmethod
    def ask(self) -> Point | None:
        """The next point to try, or ``None`` when the sampler has nothing left to propose."""

    def tell(self, point: Point, feedback: Feedback) -> None:  # noqa: B027 - optional hook
        """Learns from a finished point. Samplers that ignore history need not override it."""

    def _require_space(self) -> SearchSpace:
        if self.space is None:
            raise RuntimeError(f"{type(self).__name__}.ask() called before bind(space)")
        return self.space
