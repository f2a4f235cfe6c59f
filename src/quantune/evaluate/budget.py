"""How many rows of a feed one evaluation run may take, so a model's working memory fits the budget.

A large batch of large images can need tens of GB of intermediate tensors at once. So the first
feed's first row runs alone and its footprint is measured (:func:`quantune.memory.rows_in_budget`);
every feed of that shape then runs in pieces of as many rows as fit, and the outputs are joined
again: the same figures, a bounded peak. Latency is never measured on pieces.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quantune.memory import rows_in_budget


def batch_follows_rows(session) -> bool:
    """Whether all inputs and outputs share one symbolic first dimension, so pieces' outputs join back."""
    dims = [arg.shape[0] if arg.shape else None for arg in [*session.get_inputs(), *session.get_outputs()]]
    return bool(dims) and isinstance(dims[0], str) and all(dim == dims[0] for dim in dims)


def run_in_pieces(session: Any, names: list[str], feed: dict, sized: dict[tuple, int]) -> list:
    """``session.run`` on ``feed`` in pieces the memory budget holds; ``sized``: rows per piece, by shape."""
    total = len(next(iter(feed.values()))) if feed else 0
    if total <= 1:
        return session.run(names, feed)
    key = tuple(sorted((name, np.shape(value)[1:], np.asarray(value).dtype.str) for name, value in feed.items()))
    parts, start = [], 0
    if key not in sized:
        sized[key], first = rows_in_budget(lambda: session.run(names, {k: v[:1] for k, v in feed.items()}))
        parts, start = [first], 1
    rows = sized[key]
    if not parts and rows >= total:
        return session.run(names, feed)
    parts += [
        session.run(names, {k: v[begin : begin + rows] for k, v in feed.items()}) for begin in range(start, total, rows)
    ]
    return [np.concatenate([part[i] for part in parts], axis=0) for i in range(len(names))]
