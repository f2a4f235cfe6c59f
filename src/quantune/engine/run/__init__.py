"""One run and its phases: the opening, the original's figures, the search loop under its time budget, the ending's
confirmation and the outcome gathered and written. Names are imported on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantune._lazy import lazy_exports

_EXPORTS = {
    "Engine": "quantune.engine.run.engine",
    "RunLoop": "quantune.engine.run.loop",
    "RunListener": "quantune.engine.run.loop",
    "RunStatus": "quantune.engine.run.loop",
    "Judge": "quantune.engine.run.loop",
    "search_problem": "quantune.engine.run.problem",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports("quantune.engine.run", _EXPORTS, globals())

if TYPE_CHECKING:  # names for type checkers and IDEs; loaded lazily above
    from quantune.engine.run.engine import Engine  # noqa: F401
    from quantune.engine.run.loop import Judge, RunListener, RunLoop, RunStatus  # noqa: F401
    from quantune.engine.run.problem import search_problem  # noqa: F401
