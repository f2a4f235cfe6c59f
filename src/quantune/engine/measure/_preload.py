"""What the fork server imports once, before it forks any worker (``quantune.forkserver.PRELOAD``).

Everything a worker needs before its first line of work: numpy, onnx, onnxruntime and its
quantizers, and quantune's engine. Not onnxruntime's symbolic shape inference (with sympy,
slow to import): only an ``extended`` pre-optimization needs it, and the fork server forks no
worker before its preload is done -- with it, the original's evaluation, the first worker of
every run, would start that much later. A
worker that will need it loads it in a thread as it starts (``prepare.shapes.load_in_background``).
"""

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
