"""The four agreement figures of a candidate in one pass over its outputs and the reference's.

Metric by metric, each output would be stacked and converted to float64 four times; here the
feeds are cut into the same row blocks without stacking, each block converted once for every
figure, in two threads. The figures are the functions' own, bit for bit; what the one pass does
not cover (shapes unlike the reference's, scalars, empty outputs) goes through the functions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from quantune.evaluate.feeds import output_samples, over_feeds
from quantune.evaluate.metrics import (
    AGREEMENT_METRICS,
    BLOCK_ELEMENTS,
    broken_outputs,
    flat_outputs,
    output_cosines,
    top1_agree,
)
from quantune.memory import reused_blocks

FUSED = ("top1_agreement", "cosine", "l2", "max_abs_diff")
THREADS = 2


def agreement_figures(outputs: list[np.ndarray], references: list[np.ndarray]) -> dict[str, float]:
    """Every agreement figure of per-feed ``outputs`` against ``references``, as ``over_feeds`` gives them."""
    if tuple(AGREEMENT_METRICS) != FUSED or not _fusable(outputs, references):
        return {name: over_feeds(name, func, outputs, references) for name, func in AGREEMENT_METRICS.items()}
    if _stacks(outputs) and _stacks(references):
        return _one_pass(outputs, references)
    # feeds that do not stack (widths that follow the input): each feed's figures, combined as over_feeds does
    per_feed = [_one_pass([out], [ref]) for out, ref in zip(outputs, references, strict=True)]
    figures = {}
    for name in FUSED:
        values = [feed[name] for feed in per_feed]
        if name == "max_abs_diff":
            figures[name] = float(max(values))
        else:
            weights = [output_samples(name, out) for out in outputs]
            figures[name] = float(np.average(values, weights=weights))
    return figures


def _one_pass(outputs: list[np.ndarray], references: list[np.ndarray]) -> dict[str, float]:
    """The figures of feeds that stack, from blocks of about ``BLOCK_ELEMENTS`` elements."""
    step = max(1, BLOCK_ELEMENTS // max(1, outputs[0][0].size))
    with reused_blocks():  # equal blocks, one after the other: from the heap, not mapped each time
        blocks = _map(zip(_row_blocks(outputs, step), _row_blocks(references, step), strict=True))
        broken = any(dist is None for _, _, dist, _ in blocks)
        return {
            "top1_agreement": float(np.mean(np.concatenate([agree for agree, _, _, _ in blocks]))),
            "cosine": float(np.mean(np.concatenate([sims for _, sims, _, _ in blocks]))),
            "l2": float("inf")
            if broken
            else float(np.mean(np.concatenate([d for _, _, d, _ in blocks if d is not None]))),
            "max_abs_diff": float("inf") if broken else float(max(largest for _, _, _, largest in blocks)),
        }


def _fusable(outputs: list[np.ndarray], references: list[np.ndarray]) -> bool:
    """Non-empty arrays of at least two axes (a batch and a class axis), each shaped as its reference."""
    if not outputs or len(outputs) != len(references):
        return False
    return all(
        isinstance(o, np.ndarray) and isinstance(r, np.ndarray) and o.ndim >= 2 and o.size and o.shape == r.shape
        for o, r in zip(outputs, references, strict=True)
    )


def _stacks(arrays: list[np.ndarray]) -> bool:
    """What ``dataset.stack`` would concatenate: one dtype, one shape after the first axis."""
    first = arrays[0]
    return all(a.shape[1:] == first.shape[1:] and a.dtype == first.dtype for a in arrays)


def _row_blocks(arrays: list[np.ndarray], step: int) -> Iterator[np.ndarray]:
    """The rows of ``arrays`` in blocks of ``step`` rows, without concatenating them all."""
    pending: list[np.ndarray] = []
    count = 0
    for array in arrays:
        start = 0
        while start < len(array):
            take = min(step - count, len(array) - start)
            pending.append(array[start : start + take])
            count += take
            start += take
            if count == step:
                yield pending[0] if len(pending) == 1 else np.concatenate(pending)
                pending, count = [], 0
    if pending:
        yield pending[0] if len(pending) == 1 else np.concatenate(pending)


Block = tuple[np.ndarray, np.ndarray, np.ndarray | None, float]


def _block(pair: tuple[np.ndarray, np.ndarray]) -> Block:
    """One block's agreement, cosines, distances (``None``: not finite) and largest difference."""
    out, ref = pair
    agree = top1_agree(out, ref).reshape(-1)
    a, b = flat_outputs(out), flat_outputs(ref)
    sims = output_cosines(a, b)
    if broken_outputs(a).any():
        return agree, sims, None, float("inf")
    diff = a - b
    return agree, sims, np.linalg.norm(diff, axis=1), float(np.max(np.abs(diff)))


def _map(pairs: Iterator[tuple[np.ndarray, np.ndarray]]) -> list[Block]:
    """``_block`` over ``pairs`` in order, at most two blocks ahead of the ones running."""
    results: list[Block] = []
    with ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="quantune-agreement") as pool:
        running: deque[Future[Block]] = deque()
        for pair in pairs:
            running.append(pool.submit(_block, pair))
            if len(running) >= 2 * THREADS:
                results.append(running.popleft().result())
        results.extend(future.result() for future in running)
    return results
