"""One trial: what is asked and what comes back, the runner that runs it (built from the config,
with its evaluation backend and time limits), how its failures are classed, and which trials
the selection keeps.

Names are imported on first use (see ``quantune.engine``).
"""

from __future__ import annotations

from quantune._lazy import lazy_exports

_EXPORTS = {
    "Trial": "quantune.engine.trials.trial",
    "TrialRecord": "quantune.engine.trials.trial",
    "RunContext": "quantune.engine.trials.runner",
    "TrialRunner": "quantune.engine.trials.runner",
    "RunParts": "quantune.engine.trials.setup",
    "build_run": "quantune.engine.trials.setup",
    "preflight": "quantune.engine.trials.setup",
    "KnownFailures": "quantune.engine.trials.failures",
    "classify_failure": "quantune.engine.trials.failures",
    "run_sources": "quantune.engine.trials.identity",
    "TrialLimit": "quantune.engine.trials.limits",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports("quantune.engine.trials", _EXPORTS, globals())
