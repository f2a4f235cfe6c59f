"""What the fork server imports once, before it forks any worker (``quantune.forkserver.PRELOAD``).

Not onnxruntime's symbolic shape inference (slow to import, needed by an ``extended`` pre-optimization only): the fork
server forks no worker before its preload is done. A worker that needs it loads it in a thread as it starts."""

from __future__ import annotations

import numpy  # noqa: F401
import onnx  # noqa: F401
import onnxruntime
import onnxruntime.quantization  # noqa: F401

import quantune.engine.executors.stage
import quantune.engine.executors.worker
import quantune.engine.measure.baseline
import quantune.engine.measure.prebuild
import quantune.engine.measure.probes  # noqa: F401
