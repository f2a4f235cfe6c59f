"""What a run leaves: the verdict, the result and the files that record it (``results.json``,
``best/``), and the output folder that holds them.

Names are imported on first use (see ``quantune.engine``).
"""

from __future__ import annotations

from quantune._lazy import lazy_exports

_EXPORTS = {
    "Result": "quantune.engine.outcome.result",
    "write_outputs": "quantune.engine.outcome.result",
    "decide": "quantune.engine.outcome.verdict",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports("quantune.engine.outcome", _EXPORTS, globals())
