"""Search spaces: named parameters with their domains, conditions and validity rules.

Parameters: :class:`Categorical` (optionally weighted), :func:`Boolean`, :class:`IntRange`,
:class:`FloatRange` (stepped or continuous), :class:`Joint` (coupled values) and
:class:`Conditional` (a domain chosen by parent values). :class:`SearchSpace` counts, lists
and samples them without ever materialising the space.
"""

from __future__ import annotations

from quantune.space.params import Boolean, Categorical, Conditional, Domain, Joint, Param
from quantune.space.ranges import FloatRange, IntRange
from quantune.space.space import Point, SearchSpace, point_key

__all__ = [
    "Boolean",
    "Categorical",
    "Conditional",
    "Domain",
    "FloatRange",
    "IntRange",
    "Joint",
    "Param",
    "Point",
    "SearchSpace",
    "point_key",
]
