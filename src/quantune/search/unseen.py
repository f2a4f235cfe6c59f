"""Seeded random valid points not yet proposed, for samplers that must never repeat a point.

Seen or invalid draws are rejected; once most of a finite space has been seen, rejection would
spin, so the draws switch to a shuffled list of what remains (for spaces small enough to list).
"""

from __future__ import annotations

import random

from quantune.space import Point, SearchSpace, point_key

MAX_REJECTIONS = 200
LISTABLE = 200_000


class UnseenPoints:
    """``next()`` gives a valid point whose key is not in ``seen`` (the caller's set; invalid draws
    are added here), or ``None`` when none is left (or found, in a space too large to list)."""

    def __init__(self, space: SearchSpace, rng: random.Random, seen: set[str]) -> None:
        self.space = space
        self.rng = rng
        self.seen = seen
        self.size = space.raw_size()
        self._remaining: list[Point] | None = None

    def next(self) -> Point | None:
        if self._remaining is None:
            for _ in range(MAX_REJECTIONS):
                point = self.space.sample(self.rng)
                key = point_key(point)
                if key in self.seen:
                    continue
                if self.space.is_valid(point):
                    return point
                self.seen.add(key)
            if self.size > LISTABLE:
                return None
            self._remaining = [p for p in self.space.iterate() if point_key(p) not in self.seen]
            self.rng.shuffle(self._remaining)
        while self._remaining:
            point = self._remaining.pop()
            if point_key(point) not in self.seen:  # the caller may have proposed it meanwhile
                return point
        return None
