"""Random search without replacement, reproducible from its seed.

Each parameter is drawn given its parents: uniformly over a categorical's values (in
proportion to their weights when weighted), uniformly or log-uniformly over a range. Draws
are rejected when already seen (compared by exact value, so a continuous range is simply
never exhausted) or invalid. Once most of a finite space has been seen, rejection would
spin, so the sampler switches to a shuffled list of what remains: the switch happens only
for spaces small enough to list.
"""

from __future__ import annotations

import random

from quantune.search.base import Sampler
from quantune.search.registry import register_sampler
from quantune.space import Point, SearchSpace, point_key

_MAX_REJECTIONS = 200
_LISTABLE = 200_000


@register_sampler("random")
class RandomSampler(Sampler):
    """Draws each parameter given its parents; never proposes a point twice."""

    name = "random"

    def bind(self, space: SearchSpace) -> None:
        super().bind(space)
        self._rng = random.Random(self.seed)
        self._seen: set[str] = set()
        self._remaining: list[Point] | None = None
        self._size = space.raw_size()

    def ask(self) -> Point | None:
        space = self._require_space()
        if self._remaining is not None:
            return self._remaining.pop() if self._remaining else None
        for _ in range(_MAX_REJECTIONS):
            point = space.sample(self._rng)
            key = point_key(point)
            if key in self._seen:
                continue
            self._seen.add(key)
            if space.is_valid(point):
                return point
        if self._size > _LISTABLE:
            return None
        self._remaining = [p for p in space.iterate() if point_key(p) not in self._seen]
        self._rng.shuffle(self._remaining)
        return self.ask()
