"""Search spaces: named parameters with their choices, conditions and validity rules."""

from __future__ import annotations

from quantune.space.params import Boolean, Categorical, Conditional, Param
from quantune.space.space import Point, SearchSpace, point_key

__all__ = ["Boolean", "Categorical", "Conditional", "Param", "Point", "SearchSpace", "point_key"]
