"""What a pass that times models is given: the run's timed feed, under the run's latency settings,
so it times exactly as the evaluation will; their fingerprint enters the pass's cache key."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from quantune.evaluate.latency import LatencySpec


@dataclass(frozen=True)
class PassTiming:
    feed: dict[str, np.ndarray] = field(compare=False)
    spec: LatencySpec
    runner: Callable | None = field(default=None, compare=False)
    runner_name: str | None = None

    @property
    def fingerprint(self) -> str:
        """The feed's names, dtypes, shapes and bytes, the latency settings and the runner's name."""
        digest = hashlib.sha256()
        for name in sorted(self.feed):
            array = np.ascontiguousarray(self.feed[name])
            digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
            digest.update(array.tobytes())
        digest.update(repr(sorted(vars(self.spec).items())).encode())
        digest.update(str(self.runner_name).encode())
        return digest.hexdigest()


def timing_for(evaluator: Any) -> PassTiming:
    """The timing an :class:`~quantune.evaluate.Evaluator` does: its timed feed, latency settings and runner."""
    spec = evaluator.spec
    return PassTiming(evaluator.latency_feed, spec.latency, spec.runner, spec.runner_name)
