"""What the fork server imports once, before it forks any worker (``quantune.forkserver.PRELOAD``). Not symbolic shape
inference: slow to import and rarely needed, a worker loads it in a thread."""

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
