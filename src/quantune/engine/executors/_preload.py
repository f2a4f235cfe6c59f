"""What the fork server imports once, before it forks any worker (``quantune.forkserver.PRELOAD``).

Everything a worker needs before its first line of work: numpy, onnx, onnxruntime and its
quantizers, quantune's engine, and onnxruntime's symbolic shape inference (with sympy) --
loaded from its file, as ``prepare.shapes`` does, because importing it through the
``onnxruntime.tools`` package imports torch whenever torch is installed (1.35 s here, before
the first worker could start).
"""

from __future__ import annotations

import contextlib

import numpy  # noqa: F401
import onnx  # noqa: F401
import onnxruntime
import onnxruntime.quantization  # noqa: F401

import quantune.engine.baseline
import quantune.engine.executors.stage
import quantune.engine.executors.worker
import quantune.engine.prebuild
import quantune.engine.probes  # noqa: F401
from quantune.prepare.shapes import symbolic_shape_inference

# without sympy (or with an onnxruntime that moved it) each worker imports it itself, or does
# without; a fork server that failed to start would stop every worker
with contextlib.suppress(Exception):
    symbolic_shape_inference()
