"""Bisection on how many of the most sensitive groups stay in high precision: "the top k in fp32" is (close to) monotone
in k, so the smallest feasible k takes ``1 + ceil(log2 n)`` evaluations, not one per group. Kept pure (``next_k`` /
``record``) so asks and tells can drive it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from quantune.graph.capability import Group


@dataclass
class Bisection:
    """Smallest k in ``[1, n]`` with ``feasible(k)``, assuming feasibility is monotone in k."""

    n: int
    lo: int = 0  # largest k known infeasible
    hi: int | None = None  # smallest k known feasible
    exhausted: bool = False  # k = n was infeasible

    def next_k(self) -> int | None:
        """The next k to evaluate, or None when the answer (``hi``) is known or none exists."""
        if self.n <= 0 or self.exhausted:
            return None
        if self.hi is None:
            return self.n
        if self.hi - self.lo <= 1:
            return None
        return (self.lo + self.hi) // 2

    def record(self, k: int, feasible: bool) -> None:
        if feasible:
            self.hi = k if self.hi is None else min(self.hi, k)
        else:
            self.lo = max(self.lo, k)
            if k >= self.n:
                self.exhausted = True

    @property
    def answer(self) -> int | None:
        return self.hi


def minimal_k(n: int, feasible: Callable[[int], bool]) -> tuple[int | None, list[int]]:
    """Runs the bisection against ``feasible``; returns (smallest feasible k or None, ks evaluated)."""
    search = Bisection(n)
    order: list[int] = []
    while (k := search.next_k()) is not None:
        order.append(k)
        search.record(k, feasible(k))
    return search.answer, order


def repeated_blocks(
    blocks: Mapping[str, Sequence[str]], ranked_scores: list[tuple[Group, float]]
) -> list[tuple[str, list[Group]]]:
    """Repeated blocks (transformer layers) with their candidate groups, most sensitive first."""
    if len(blocks) < 2:
        return []
    score = {group.name: value for group, value in ranked_scores}
    order = [group for group, _ in ranked_scores]
    found = []
    for block, names in blocks.items():
        members = set(names)
        groups = [g for g in order if g.name in members]
        if groups:
            found.append((block, groups, sum(score[g.name] for g in groups)))
    if len(found) < 2:
        return []
    found.sort(key=lambda item: -item[2])
    return [(block, groups) for block, groups, _ in found]
