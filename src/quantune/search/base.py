"""The sampler interface: ``ask`` for the next point, ``tell`` what it scored.

A sampler never touches files or models. It sees a :class:`~quantune.space.SearchSpace`,
proposes points, and learns from :class:`Feedback`. The engine decides what a score is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from quantune.space import Point, SearchSpace


@dataclass(frozen=True)
class Feedback:
    """What one point scored.

    ``objective`` is the value to minimise (``None`` when the trial failed); ``violation`` is
    how far the point is from meeting the accuracy criterion (0 when it meets it), which
    constrained samplers use to steer towards feasible points.
    """

    objective: float | None
    violation: float = 0.0

    @property
    def failed(self) -> bool:
        return self.objective is None


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
