"""How many rows of a feed one evaluation run may take, so a model's working memory fits the budget.

An evaluation feed is what the user's data gives (a table's ``batch_size`` rows, or a loader's
feed): a large batch of large images can need tens of GB of intermediate tensors at once,
though one image needs a few hundred MB. onnxruntime frees each intermediate tensor
after its last reader, so its working set is the largest set of tensors alive at once; that
is estimated here without running anything (ONNX shape inference at the feed's shapes, one
row, and each tensor alive from its producer to its last consumer in graph order), doubled for
kernels' scratch space. A feed larger than the budget (:func:`quantune.memory.memory_budget_mb`,
from ``executor.memory_limit_mb`` or the machine's memory) is run in pieces along its first
axis and the pieces' outputs joined again: the figures are the same, the peak is bounded.
Latency is never measured on pieces (it is timed at the configured batch).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantune.memory import memory_budget_mb

log = logging.getLogger("quantune.evaluate")

_SCRATCH = 2  # kernels' own buffers (im2col, packed weights) on top of the live tensors


def live_peak_bytes(model: onnx.ModelProto, sizes: Mapping[str, int]) -> int | None:
    """The largest total of tensors alive at once in graph order; ``None`` if a size is unknown."""
    last_use: dict[str, int] = {}
    for index, node in enumerate(model.graph.node):
        for name in node.input:
            last_use[name] = index
    outputs = {out.name for out in model.graph.output}
    inits = {init.name for init in model.graph.initializer}
    live = sum(sizes.get(i.name, 0) for i in model.graph.input if i.name not in inits)
    peak = live
    for index, node in enumerate(model.graph.node):
        for out in node.output:
            if not out:
                continue
            if out not in sizes:
                return None
            live += sizes[out]
        peak = max(peak, live)
        for name in set(node.input) | set(node.output):
            if name and name not in inits and name not in outputs and last_use.get(name, -1) <= index:
                live -= sizes.get(name, 0)
    return peak


@lru_cache(maxsize=32)
def _per_row(model_path: str, mtime: float, shapes: tuple[tuple[str, tuple[int, ...]], ...]) -> int | None:
    from quantune.evaluate.sensitivity.capture import tensor_bytes

    model = onnx.load(model_path, load_external_data=False)
    sizes = tensor_bytes(model, dict(shapes))
    if not sizes:
        return None
    peak = live_peak_bytes(model, sizes)
    return None if peak is None else peak * _SCRATCH


def rows_per_run(model: Path, feed: Mapping[str, np.ndarray], budget_mb: float | None = None) -> int | None:
    """Rows of ``feed`` one run may take within the budget, or ``None``: run it whole.

    Whole when the estimate is unknown (shape inference does not settle), when the feed
    fits, or when the model's batch dimension is fixed (it cannot be cut).
    """
    rows = len(next(iter(feed.values()))) if feed else 0
    if rows <= 1:
        return None
    try:
        shapes = tuple(sorted((name, (1, *np.shape(value)[1:])) for name, value in feed.items()))
        per_row = _per_row(str(model), Path(model).stat().st_mtime, shapes)
    except Exception as exc:  # an estimate is a bound, never a reason to fail the evaluation
        log.debug("no working-memory estimate for %s: %s", model, exc)
        return None
    if not per_row:
        return None
    budget = (memory_budget_mb() if budget_mb is None else budget_mb) * 1024 * 1024
    fit = max(1, int(budget // per_row))
    return fit if fit < rows else None


def batch_follows_rows(session) -> bool:
    """Whether every input and output of ``session`` has the same symbolic first dimension, so
    a feed cut into pieces along it gives outputs that join back along it (an in-graph NMS's
    box list, a scalar, a fixed batch: never cut)."""
    dims = [arg.shape[0] if arg.shape else None for arg in [*session.get_inputs(), *session.get_outputs()]]
    return bool(dims) and isinstance(dims[0], str) and all(dim == dims[0] for dim in dims)


def run_in_pieces(session: Any, names: list[str], feed: dict, rows: int | None) -> list:
    """``session.run`` on ``feed``, in pieces of ``rows`` along the first axis when set (see ``rows_per_run``)."""
    if rows is None:
        return session.run(names, feed)
    total = len(next(iter(feed.values())))
    parts = [
        session.run(names, {k: v[start : start + rows] for k, v in feed.items()}) for start in range(0, total, rows)
    ]
    return [np.concatenate([part[i] for part in parts], axis=0) for i in range(len(names))]
