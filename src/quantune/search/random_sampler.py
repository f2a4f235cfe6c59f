"""Random search without replacement, reproducible from its seed (see :mod:`quantune.search.unseen`)."""

from __future__ import annotations

import random

from quantune.search.base import Sampler
from quantune.search.registry import register_sampler
from quantune.search.unseen import UnseenPoints
from quantune.space import Point, SearchSpace, point_key


@register_sampler("random")
class RandomSampler(Sampler):
    """Draws each parameter given its parents; never proposes a point twice."""

    name = "random"

    def bind(self, space: SearchSpace) -> None:
        super().bind(space)
        self._seen: set[str] = set()
        self._draws = UnseenPoints(space, random.Random(self.seed), self._seen)

    def ask(self) -> Point | None:
        self._require_space()
        point = self._draws.next()
        if point is not None:
            self._seen.add(point_key(point))
        return point
