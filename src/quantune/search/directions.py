"""Which samplers get every objective of a multi-objective run.

With ``objectives: [latency, memory]`` a sampler that models several objectives (NSGA-II,
TPE's multi-objective mode, GP, QMC: an Optuna sampler whose class says ``multi_objective``)
is built with one ``minimize`` direction per objective and told every value; the others
(random, exhaustive, CMA-ES) are built as before and optimise the first objective.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from quantune.search.registry import get_sampler


def sampler_directions(name: str, objectives: Sequence[str]) -> dict[str, Any]:
    """``{"directions": (...)}`` for ``create_sampler(name, ...)`` when it takes several objectives, else ``{}``."""
    if len(objectives) < 2:
        return {}
    cls = get_sampler(name)
    if not getattr(cls, "multi_objective", False) or "directions" not in inspect.signature(cls).parameters:
        return {}
    return {"directions": tuple("minimize" for _ in objectives)}
