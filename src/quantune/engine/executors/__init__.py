"""Where trials run: in this process, in isolated worker processes, or on a Ray cluster; and the
stage workers the heavy one-off measurements run in.

Names are imported on first use (see ``quantune.engine``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantune._lazy import lazy_exports

_EXPORTS = {
    "Executor": "quantune.engine.executors.base",
    "InProcessExecutor": "quantune.engine.executors.base",
    "ProcessExecutor": "quantune.engine.executors.process",
    "WorkerSpec": "quantune.engine.executors.worker",
    "create_executor": "quantune.engine.executors.factory",
    "Isolation": "quantune.engine.executors.stage",
    "run_stage": "quantune.engine.executors.stage",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports("quantune.engine.executors", _EXPORTS, globals())

if TYPE_CHECKING:  # names for type checkers and IDEs; loaded lazily above
    from quantune.engine.executors.base import Executor, InProcessExecutor  # noqa: F401
    from quantune.engine.executors.factory import create_executor  # noqa: F401
    from quantune.engine.executors.process import ProcessExecutor  # noqa: F401
    from quantune.engine.executors.stage import Isolation, run_stage  # noqa: F401
    from quantune.engine.executors.worker import WorkerSpec  # noqa: F401
