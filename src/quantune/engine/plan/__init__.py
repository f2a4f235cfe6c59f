"""From config to plan: the steps, the flows through them, the rules that prune them, and one
search space over all (provider axis included).

Names are imported on first use (see ``quantune.engine``).
"""

from __future__ import annotations

from quantune._lazy import lazy_exports

_EXPORTS = {
    "Plan": "quantune.engine.plan.plan",
    "Step": "quantune.engine.plan.plan",
    "build_plan": "quantune.engine.plan.plan",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports("quantune.engine.plan", _EXPORTS, globals())
