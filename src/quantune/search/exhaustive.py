"""Exhaustive search: every valid point once, lazily, in the space's fixed order."""

from __future__ import annotations

from collections.abc import Iterator

from quantune.search.base import Sampler
from quantune.search.registry import register_sampler
from quantune.space import Point, SearchSpace


@register_sampler("exhaustive")
class ExhaustiveSampler(Sampler):
    """Walks the space depth first; never holds more than one point in memory."""

    name = "exhaustive"

    def bind(self, space: SearchSpace) -> None:
        super().bind(space)
        self._points: Iterator[Point] = space.iterate()

    def ask(self) -> Point | None:
        self._require_space()
        return next(self._points, None)
