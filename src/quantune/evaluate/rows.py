"""What an evaluation scored right or wrong row by row can tell: the budget in rows, and whether a
candidate's loss is more than the evaluation's sampling noise.

A top-1 figure moves in steps of one row, so a budget finer than one row accepts only candidates
that lose no row net (said once: :func:`resolution_warning`). Paired with the original row by
row, only the discordant rows (``rows_worse``, ``rows_better``) say anything about a difference:
the exact two-sided sign test on them (exact McNemar) gives ``loss_p_value``, with no resampling
and no seed. Metrics without a right or wrong per row get none of these figures.
"""

from __future__ import annotations

import math

import numpy as np

ROW_METRICS = ("top1", "top1_agreement")
NOISE_P = 0.05  # a loss whose p-value is at least this is within the evaluation's sampling noise


def row_figures(
    metric: str,
    figures: dict[str, float],
    first: list[np.ndarray],
    reference: list[np.ndarray] | None,
    labels: list[np.ndarray] | None,
) -> dict[str, float]:
    """``rows_scored``; against ``reference`` (None: the original) ``rows_worse``, ``rows_better``, ``loss_p_value``."""
    if metric not in ROW_METRICS or not first or any(np.ndim(out) < 1 for out in first):
        return {}
    rows = sum(out.size // max(1, out.shape[-1]) for out in first)
    if reference is None:
        return {"rows_scored": float(rows)}
    if metric == "top1_agreement":  # the original agrees with itself on every row
        worse, better = round((1.0 - figures[metric]) * rows), 0
    else:
        mine, theirs = _right(first, labels), _right(reference, labels)
        if mine is None or theirs is None or len(mine) != len(theirs):
            return {}
        worse, better = int(np.sum(theirs & ~mine)), int(np.sum(mine & ~theirs))
    return {
        "rows_scored": float(rows),
        "rows_worse": float(worse),
        "rows_better": float(better),
        "loss_p_value": sign_test_p(worse, better),
    }


def _right(outputs: list[np.ndarray], labels: list[np.ndarray] | None) -> np.ndarray | None:
    """Per row, whether the arg-max is the label (as ``metrics.top1`` scores it)."""
    if labels is None or len(labels) != len(outputs):
        return None
    parts = []
    for out, label in zip(outputs, labels, strict=True):
        guess = np.argmax(out, axis=-1).reshape(-1)
        if guess.size != np.size(label):
            return None
        parts.append(guess == np.reshape(label, -1))
    return np.concatenate(parts)


def sign_test_p(worse: int, better: int) -> float:
    """The chance that ``worse + better`` fair coin tosses split at least as unevenly (1.0: none)."""
    n, k = worse + better, min(worse, better)
    if n == 0:
        return 1.0
    log_half = n * math.log(0.5)
    tail = sum(
        math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + log_half) for i in range(k + 1)
    )
    return min(1.0, 2.0 * tail)


def budget_rows(kind: str, tolerable_loss: float, score: float, rows: int) -> float:
    """How many rows a criterion lets a candidate lose net, on ``rows`` rows scored ``score``."""
    return tolerable_loss * (abs(score) if kind == "relative" else 1.0) * rows


def _resolution(metric: str, tolerable_loss: float, baseline: dict[str, float]) -> tuple[int, float] | None:
    """(rows scored, the original's score) where the budget can be counted in rows, else ``None``."""
    rows, score = int(baseline.get("rows_scored", 0)), baseline.get(metric)
    if metric not in ROW_METRICS or rows <= 0 or score is None or not math.isfinite(tolerable_loss):
        return None
    return rows, score


def budget_words(kind: str, tolerable_loss: float, metric: str, baseline: dict[str, float]) -> str:
    """The budget in rows of the evaluation (``""`` for a metric not scored row by row)."""
    if (known := _resolution(metric, tolerable_loss, baseline)) is None:
        return ""
    rows, score = known
    return (
        f"a candidate may lose {budget_rows(kind, tolerable_loss, score, rows):.3g} of the {rows} evaluation rows net"
    )


def resolution_warning(kind: str, tolerable_loss: float, metric: str, baseline: dict[str, float]) -> str:
    """Why the budget is finer than one row of the evaluation, and what would resolve it (or ``""``)."""
    if (known := _resolution(metric, tolerable_loss, baseline)) is None:
        return ""
    rows, score = known
    allowed = budget_rows(kind, tolerable_loss, score, rows)
    if allowed >= 1.0:
        return ""
    step = 1.0 / rows
    if kind == "relative":
        unit = f"{step / max(abs(score), 1e-12):.2%} of the original's {metric} ({score:.4g})"
        needed = math.ceil(1.0 / max(tolerable_loss * abs(score), 1e-12))
    else:
        unit = f"{step:.4g}"
        needed = math.ceil(1.0 / max(tolerable_loss, 1e-12))
    return (
        f"criterion.tolerable_loss: {tolerable_loss:g} ({kind}) is {allowed:.2g} of the evaluation's {rows} "
        f"row(s), finer than one row: one row moves {metric} by {unit}, so only candidates that lose no row net "
        f"meet it, and a loss this small cannot be measured; evaluate on at least {needed} rows (data.evaluation) "
        "or allow one row's loss"
    )


def noise_note(metrics: dict[str, float]) -> str:
    """The words for an accuracy change within the sampling noise (or ``""``)."""
    worse, better, p = metrics.get("rows_worse"), metrics.get("rows_better"), metrics.get("loss_p_value")
    if worse is None or better is None or p is None or worse + better == 0 or p < NOISE_P:
        return ""
    rows = int(metrics.get("rows_scored", 0))
    return (
        f"its accuracy differs from the original's within the evaluation's sampling noise ({int(worse)} of "
        f"{rows} rows worse, {int(better)} better; exact sign test p = {p:.2f})"
    )
