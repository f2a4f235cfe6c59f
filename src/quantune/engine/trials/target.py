"""The config's ``target:`` as an evaluation backend, checked before anything runs.

Without ``target.python`` models are evaluated here on ``target.provider``; with it, in that
interpreter's environment through its evaluation server (``evaluate/backend.py``). Either way
a target that cannot work -- no such interpreter, no onnxruntime there, the provider missing --
is one line naming ``target.python`` or ``target.provider`` before the output folder is claimed.
"""

from __future__ import annotations

import os
import shutil

from quantune.config import LoadedConfig
from quantune.errors import ConfigError
from quantune.evaluate.backend import Backend, LocalBackend
from quantune.evaluate.target_backend import TargetBackend


def target_backend(loaded: LoadedConfig) -> Backend:
    """The checked backend for ``loaded``'s target (its evaluation runner imported there too)."""
    config = loaded.config
    target = config.target
    backend: Backend
    runner = None
    if config.evaluation.runner and ".py:" in config.evaluation.runner:
        path, _, function = config.evaluation.runner.rpartition(":")
        runner = f"{loaded.resolve(path)}:{function}"
    timing_resource = config.executor.target if config.executor.kind == "ray" else "driver"
    if target.python is None:
        backend = LocalBackend(target.provider, target.provider_options, timeout_s=target.timeout_s, runner=runner)
        if timing_resource != "driver":  # the timings on the cluster's target nodes (trials/ray_target.py)
            from quantune.engine.trials.ray_target import RayTargetBackend

            backend = RayTargetBackend(backend, timing_resource, config.executor.address)
    elif timing_resource != "driver":
        raise ConfigError("executor.target: a Ray target and target.python do not go together; leave one out")
    else:
        python = _interpreter(loaded, target.python)
        backend = TargetBackend(
            python,
            target.provider,
            target.provider_options,
            timeout_s=target.timeout_s,
            memory_limit_mb=config.executor.memory_limit_mb,
            runner=runner,
        )
    backend.check()
    return backend


def _interpreter(loaded: LoadedConfig, python: str) -> str:
    """An absolute path relative to the config's folder, symlinks kept: only a venv's link starts that venv."""
    if "/" not in python:  # a command name: found on PATH
        return shutil.which(python) or python
    return os.path.abspath(loaded.base_dir / os.path.expanduser(python))
