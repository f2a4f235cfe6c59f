"""The equivalence check: a prepared model must give the original's outputs on real rows.

Float outputs may move by rounding only, relative to the output's own scale; integer and boolean
outputs may flip at most ``max_flips`` elements (a near tie).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from quantune.evaluate.budget import batch_follows_rows, run_in_pieces

Feeds = Sequence[dict[str, np.ndarray]]
RTOL = 1e-3
ATOL = 1e-4
MAX_FLIPS = 1e-3


def run_feeds(model: str | Path, feeds: Feeds) -> list[list[np.ndarray]]:
    """Every output of ``model`` for each feed, on the CPU provider, in pieces within the memory
    budget as an evaluation runs them (:mod:`quantune.evaluate.budget`)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = False  # as an evaluation's: the pieces bound the peak
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    if not batch_follows_rows(session):
        return [session.run(None, dict(feed)) for feed in feeds]
    names = [out.name for out in session.get_outputs()]
    sized: dict[tuple, int] = {}
    return [run_in_pieces(session, names, dict(feed), sized) for feed in feeds]


def outputs_differ(reference: list[list[np.ndarray]], candidate: list[list[np.ndarray]]) -> str | None:
    """Why ``candidate`` does not give ``reference``'s outputs (per feed, per output), or ``None``."""
    if len(reference) != len(candidate):
        return f"{len(candidate)} feeds' outputs instead of {len(reference)}"
    for index, (ref_outputs, new_outputs) in enumerate(zip(reference, candidate, strict=True)):
        if len(ref_outputs) != len(new_outputs):
            return f"feed {index}: {len(new_outputs)} outputs instead of {len(ref_outputs)}"
        for position, (ref, new) in enumerate(zip(ref_outputs, new_outputs, strict=True)):
            reason = _differs(np.asarray(ref), np.asarray(new))
            if reason:
                return f"feed {index}, output {position}: {reason}"
    return None


def _differs(ref: np.ndarray, new: np.ndarray) -> str | None:
    if ref.shape != new.shape:
        return f"shape {new.shape} instead of {ref.shape}"
    if ref.dtype != new.dtype:
        return f"dtype {new.dtype} instead of {ref.dtype}"
    if ref.size == 0:
        return None
    if not np.issubdtype(ref.dtype, np.floating):
        flips = float(np.mean(ref != new))
        return None if flips <= MAX_FLIPS else f"{flips:.2%} of the elements differ"
    ref64, new64 = ref.astype(np.float64), new.astype(np.float64)
    same_nan = np.isnan(ref64) == np.isnan(new64)
    if not same_nan.all():
        return "NaN where the original has none (or the reverse)"
    finite = np.isfinite(ref64)
    if not np.array_equal(ref64[~finite], new64[~finite], equal_nan=True):
        return "infinities differ"
    ref64, new64 = ref64[finite], new64[finite]
    if ref64.size == 0:
        return None
    scale = float(np.max(np.abs(ref64)))
    allowed = ATOL * scale + RTOL * np.abs(ref64)
    excess = np.abs(new64 - ref64) - allowed
    if np.all(excess <= 0):
        return None
    worst = int(np.argmax(excess))
    return (
        f"max difference {abs(new64[worst] - ref64[worst]):.4g} (value {ref64[worst]:.4g}, "
        f"output scale {scale:.4g}; allowed rtol {RTOL:g}, atol {ATOL:g} x scale)"
    )
