"""The run's ``executor.runtime_env`` as Ray's tasks take it (those that run the user's scripts).

Most of what a trial needs travels by itself (executors/ray_cargo.py: the model, the data, the scripts and
the modules beside them), but no rule can guess a file a script reaches by path (its parent folder
put on ``sys.path``, a file read beside ``__file__``): the user names those in a Ray runtime_env.

Ray takes local paths (``working_dir``, ``py_modules``) only for a whole job (``ray.init``); a task's
or an actor's own runtime_env names its packages by URI. quantune may run on a Ray it did not
start, so it packs and uploads those paths itself, as ``ray.init`` does (Ray's own packaging: links
followed, ``excludes`` and ``.gitignore`` honoured), and gives every such task the URIs. Ray
keeps an upload no job references for ten minutes; a run pins its packages again while it lasts.
"""

from __future__ import annotations

import inspect
import logging
import os
import tempfile
import threading
from typing import Any

from quantune.config.loader import is_local
from quantune.errors import QuantuneError

log = logging.getLogger("quantune.ray")

PIN_EVERY_S = 120.0  # well inside Ray's ten minutes (RAY_RUNTIME_ENV_URI_PIN_EXPIRATION_S)

# what a failure on a node says when a script missed a file: where the user names what travels
HINT = (
    "on a Ray node a script has only what travels with the run (the model, the data, the scripts and the "
    "modules beside them): name the files it reaches by path in executor.runtime_env (working_dir, "
    "py_modules; docs/how-to/ray.md)"
)
_MISSED = ("ModuleNotFoundError", "No module named", "FileNotFoundError", "No such file or directory")


def hinted(error: str | None) -> str | None:
    """``error`` with :data:`HINT` where it says a module or file was not found (once)."""
    if error and any(word in error for word in _MISSED) and "executor.runtime_env" not in error:
        return f"{error} ({HINT})"
    return error


def uploaded(env: dict[str, Any]) -> dict[str, Any]:
    """``env`` (its local paths absolute) with its local ``working_dir`` and ``py_modules`` uploaded to
    the cluster and named by URI, as ``ray.init`` does for a job's; ``excludes`` spent."""
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed
    from ray.runtime_env import RuntimeEnv

    extra: dict[str, Any] = {}
    if "include_gitignore" in inspect.signature(upload_working_dir_if_needed).parameters:  # (Ray >= 2.50)
        extra["include_gitignore"] = os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "0") != "1"
    try:
        with tempfile.TemporaryDirectory(prefix="quantune-runtime-env-") as scratch:
            env = upload_py_modules_if_needed(dict(env), scratch_dir=scratch, **extra)
            env = upload_working_dir_if_needed(env, scratch_dir=scratch, **extra)
        env.pop("excludes", None)
        RuntimeEnv(**env)  # Ray's own checks of the other fields, here rather than at the first task
    except Exception as exc:
        raise QuantuneError(f"executor.runtime_env: Ray does not take it: {type(exc).__name__}: {exc}") from None
    return env


def _packages(env: dict[str, Any]) -> list[str]:
    named = [env.get("working_dir"), *env.get("py_modules", [])]
    return [uri for uri in named if isinstance(uri, str) and uri.startswith("gcs://")]


class TaskEnv:
    """The options (``runtime_env``) of every task of a run that runs its scripts, its uploads pinned while it lasts."""

    def __init__(self, env: dict[str, Any] | None) -> None:
        self.options: dict[str, Any] = {}
        self._stop = threading.Event()
        if not env:
            return
        env = uploaded(env)
        self.options = {"runtime_env": env}
        packages = _packages(env)
        if packages:
            threading.Thread(target=self._pin, args=(packages,), name="quantune-ray-env", daemon=True).start()

    def _pin(self, packages: list[str]) -> None:
        from ray._private.runtime_env.packaging import pin_runtime_env_uri

        while not self._stop.wait(PIN_EVERY_S):
            for uri in packages:
                try:
                    pin_runtime_env_uri(uri)
                except Exception as exc:  # (Ray gone: the run is ending)
                    log.info("runtime_env: could not pin %s again: %s", uri, exc)
                    return

    def close(self) -> None:
        self._stop.set()


def working_dir(env: dict[str, Any] | None) -> list[str]:
    """The local ``working_dir`` folder of ``env`` (absolute), as named and with its links followed; none
    for a URI or an archive (scripts inside it are the node's copies, executors/ray_cargo.py)."""
    named = (env or {}).get("working_dir")
    if not isinstance(named, str) or not is_local(named) or not os.path.isdir(named):
        return []
    return list(dict.fromkeys([os.path.abspath(named), os.path.realpath(named)]))
