"""Numeric ranges: :class:`IntRange` and :class:`FloatRange`.

Both follow Optuna's ``suggest_int`` / ``suggest_float`` rules, so Optuna samplers search them
natively and CMA-ES or GP can exploit their order. A float range without a ``step`` is
continuous (size ``math.inf``). Stepped float values are computed in decimal, so every sampler
proposes the same value for a grid point and the cache sees one configuration, not two.
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, ClassVar, overload


def _integer(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    return int(value)


def _real(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise TypeError(f"{what} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class IntRange:
    """Integers from ``low`` to ``high`` (both included) in steps of ``step``.

    ``log=True`` draws log-uniformly (for values spanning orders of magnitude, such as a number
    of calibration samples); as in Optuna it needs ``step=1`` and ``low >= 1``.

    >>> IntRange(8, 64, step=8).size
    8
    """

    low: int
    high: int
    step: int = 1
    log: bool = False
    parents: tuple[str, ...] = field(default=(), init=False, repr=False)
    finite: ClassVar[bool] = True
    weights: ClassVar[None] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "low", _integer(self.low, "IntRange.low"))
        object.__setattr__(self, "high", _integer(self.high, "IntRange.high"))
        object.__setattr__(self, "step", _integer(self.step, "IntRange.step"))
        if self.low > self.high:
            raise ValueError(f"IntRange: low ({self.low}) must be <= high ({self.high})")
        if self.step < 1:
            raise ValueError(f"IntRange: step must be >= 1, got {self.step}")
        if self.log and (self.step != 1 or self.low < 1):
            raise ValueError("IntRange: log=True needs step=1 and low >= 1 (log of zero or below is undefined)")

    @property
    def size(self) -> int:
        return (self.high - self.low) // self.step + 1

    @property
    def last(self) -> int:
        """The largest value on the grid (``high`` itself when the step divides the span)."""
        return self.low + (self.size - 1) * self.step

    def visit_order(self) -> range:
        """Every value, lowest first; a ``range``, so even a huge range costs no memory."""
        return range(self.low, self.last + 1, self.step)

    def choices_given(self, point: Mapping[str, Any]) -> range:
        return self.visit_order()

    def domain_given(self, point: Mapping[str, Any]) -> IntRange:
        return self

    def draw(self, rng: random.Random) -> int:
        if not self.log:
            return self.low + self.step * rng.randrange(self.size)
        # Optuna's recipe: widen by half a unit on each side so the end values get their share.
        value = round(math.exp(rng.uniform(math.log(self.low - 0.5), math.log(self.high + 0.5))))
        return min(max(value, self.low), self.high)

    def snap(self, value: Any) -> int:
        """The grid value nearest to ``value`` (what an Optuna suggestion maps to)."""
        index = min(max(round((float(value) - self.low) / self.step), 0), self.size - 1)
        return self.low + index * self.step


class _FloatGrid(Sequence[float]):
    """``low + k * step`` for k in 0..count-1, computed in decimal on demand (never listed)."""

    def __init__(self, low: Decimal, step: Decimal, count: int) -> None:
        self._low = low
        self._step = step
        self._count = count

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> float: ...
    @overload
    def __getitem__(self, index: slice) -> list[float]: ...
    def __getitem__(self, index: int | slice) -> float | list[float]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError("grid index out of range")
        return float(self._low + index * self._step)

    def __repr__(self) -> str:
        return f"_FloatGrid(low={self._low}, step={self._step}, count={self._count})"


@dataclass(frozen=True)
class FloatRange:
    """Real numbers from ``low`` to ``high`` (both included).

    With ``step`` the range is a finite grid ``low, low + step, ...`` up to ``high``; without
    it the range is continuous (``size`` is ``math.inf``). ``log=True`` draws log-uniformly;
    as in Optuna it excludes ``step`` and needs ``low > 0``.

    >>> FloatRange(0.0, 1.0, step=0.25).size
    5
    >>> FloatRange(1e-5, 1e-1, log=True).size
    inf
    """

    low: float
    high: float
    step: float | None = None
    log: bool = False
    parents: tuple[str, ...] = field(default=(), init=False, repr=False)
    weights: ClassVar[None] = None
    _grid: _FloatGrid | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        low = _real(self.low, "FloatRange.low")
        high = _real(self.high, "FloatRange.high")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)
        if self.step is None:
            if low >= high:
                raise ValueError(f"FloatRange: low ({low}) must be < high ({high}); for one value use Categorical")
        else:
            step = _real(self.step, "FloatRange.step")
            object.__setattr__(self, "step", step)
            if step <= 0:
                raise ValueError(f"FloatRange: step must be > 0, got {step}")
            if low > high:
                raise ValueError(f"FloatRange: low ({low}) must be <= high ({high})")
            if self.log:
                raise ValueError("FloatRange: log=True and step exclude each other (as in Optuna)")
            d_low, d_step = Decimal(repr(low)), Decimal(repr(step))
            count = int((Decimal(repr(high)) - d_low) // d_step) + 1
            object.__setattr__(self, "_grid", _FloatGrid(d_low, d_step, count))
        if self.log and low <= 0:
            raise ValueError(f"FloatRange: log=True needs low > 0, got {low}")

    @property
    def finite(self) -> bool:
        return self._grid is not None

    @property
    def size(self) -> int | float:
        """Number of grid values, or ``math.inf`` for a continuous range."""
        return math.inf if self._grid is None else len(self._grid)

    @property
    def last(self) -> float:
        """The largest value the range can take (the last grid value when stepped)."""
        return self.high if self._grid is None else self._grid[-1]

    def visit_order(self) -> Sequence[float]:
        """The grid, lowest first; a continuous range has none and raises ``TypeError``."""
        if self._grid is None:
            raise TypeError(f"{self!r} is continuous and has no list of values; give it a step to enumerate it")
        return self._grid

    def choices_given(self, point: Mapping[str, Any]) -> Sequence[float]:
        return self.visit_order()

    def domain_given(self, point: Mapping[str, Any]) -> FloatRange:
        return self

    def draw(self, rng: random.Random) -> float:
        if self._grid is not None:
            return self._grid[rng.randrange(len(self._grid))]
        if self.log:
            return min(max(math.exp(rng.uniform(math.log(self.low), math.log(self.high))), self.low), self.high)
        return rng.uniform(self.low, self.high)

    def snap(self, value: Any) -> float:
        """The canonical value for ``value``: the nearest grid value, or ``value`` clipped to the range."""
        if self._grid is None:
            return min(max(float(value), self.low), self.high)
        assert self.step is not None
        index = min(max(round((float(value) - self.low) / self.step), 0), len(self._grid) - 1)
        return self._grid[index]
