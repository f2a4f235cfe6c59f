"""Exhaustive search: every valid point once, lazily, depth first, higher-weight values first."""

from __future__ import annotations

from collections.abc import Iterator

from quantune.errors import QuantuneError
from quantune.search.base import Sampler
from quantune.search.registry import register_sampler
from quantune.space import Point, SearchSpace


@register_sampler("exhaustive")
class ExhaustiveSampler(Sampler):
    """Walks the space depth first; never holds more than one point in memory."""

    name = "exhaustive"

    def bind(self, space: SearchSpace) -> None:
        continuous = space.continuous_params()
        if continuous:
            raise QuantuneError(
                f"search.sampler: 'exhaustive' cannot list the continuous parameters {continuous}; "
                "give each FloatRange a step, or choose a sampler that draws (random, tpe, cmaes, gp, qmc, nsga2)"
            )
        super().bind(space)
        self._points: Iterator[Point] = space.iterate()

    def ask(self) -> Point | None:
        self._require_space()
        return next(self._points, None)
