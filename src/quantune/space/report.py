"""Sizes and samples of a space, for people (``quantune space``), without enumerating it: exact
when small enough to walk, else estimated from seeded random draws."""

from __future__ import annotations

import random

from quantune.space.space import SearchSpace

EXACT_LIMIT = 20_000  # spaces this small are walked, not estimated
_DRAWS = 2_000


def pruned_size(space: SearchSpace, raw: float) -> tuple[float, bool]:
    """(size after rules, exact?)"""
    if raw <= EXACT_LIMIT:
        return sum(1 for _ in space.iterate()), True
    rng = random.Random(0)
    valid = sum(space.is_valid(space.sample(rng)) for _ in range(_DRAWS))
    return raw * valid / _DRAWS, False


def format_point(point: dict) -> str:
    """``a=1, b=x``, with per-element flags ``p[e]=True`` folded into ``p=[e, ...]``."""
    parts: dict[str, str] = {}
    folded: dict[str, list[str]] = {}
    for name, value in point.items():
        if name.endswith("]") and "[" in name:
            base, element = name[:-1].split("[", 1)
            folded.setdefault(base, [])
            if value:
                folded[base].append(element)
            parts.setdefault(base, "")
        else:
            parts[name] = str(value)
    for base, elements in folded.items():
        parts[base] = "[" + ", ".join(elements) + "]"
    return ", ".join(f"{name}={value}" for name, value in parts.items()) or "(no searched parameters)"


def describe_space(title: str, space: SearchSpace, samples: int = 3, seed: int = 0) -> str:
    raw = space.raw_size()
    pruned, exact = pruned_size(space, raw)
    lines = [
        title,
        f"  parameters: {len(space)}",
        f"  raw size: {raw:,}" if isinstance(raw, int) else f"  raw size: {raw}",
        f"  after pruning: {pruned:,.0f}" + ("" if exact else f" (estimated from {_DRAWS} random draws)"),
    ]
    rng = random.Random(seed)
    shown = 0
    for _ in range(samples * 50):
        if shown == samples:
            break
        point = space.sample(rng)
        if space.is_valid(point):
            lines.append(f"  sample: {format_point(point)}")
            shown += 1
    return "\n".join(lines)
