"""Proposals every strategy runs first: the original on each execution provider (``target.providers``).

The provider alone can move latency as much as quantization does, with no accuracy lost, so the
original on every other provider is a candidate like any other. The wrapped strategy never sees
these trials; what they scored (and their paired latency ratio) is in its ``learned()``. A
strategy that weighs them is told each outcome (``observe_opening``) and first asked only once
every opening was told, so a run decides the same way with several workers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from quantune.strategy.base import WAIT, Outcome, Proposal, SearchProblem, Strategy

STAGE = "provider original"


class WithOpenings(Strategy):
    """``inner``, after ``openings`` (each asked once, in order, and told to no one else)."""

    def __init__(self, inner: Strategy, openings: Sequence[tuple[str, Proposal]], deadline: Any = None) -> None:
        self.inner = inner
        # past ``deadline`` (stop.timeout_s) the openings not yet run are skipped with a note
        self.deadline = deadline
        self.name = inner.name
        self.Options = inner.Options
        self._openings = list(openings)  # (label, proposal)
        self._asked: dict[int, str] = {}  # id of an opening proposal -> its label
        self.scores: dict[str, dict[str, float | None]] = {}

    def bind(self, problem: SearchProblem) -> None:
        self.inner.bind(problem)
        self.problem = problem

    def observe_baseline(self, metrics: Mapping[str, float]) -> None:
        self.inner.observe_baseline(metrics)
        self.baseline = self.inner.baseline

    # the inner strategy's, read and written through (settable: they override the base's attributes)
    @property
    def finished_reason(self) -> str:
        return self.inner.finished_reason

    @finished_reason.setter
    def finished_reason(self, reason: str) -> None:
        self.inner.finished_reason = reason

    @property
    def original_wins(self) -> str:
        return "" if self._won() else self.inner.original_wins

    @original_wins.setter
    def original_wins(self, reason: str) -> None:
        self.inner.original_wins = reason

    def _out_of_time(self) -> bool:
        return self.deadline is not None and self.deadline.left_s() == 0.0

    def ask(self) -> Proposal | None:
        if self._openings and self._out_of_time():
            for label, _ in self._openings:
                self.scores[label] = {"skipped": "no time left within stop.timeout_s"}
            self._openings.clear()
        if self._openings:
            label, proposal = self._openings.pop(0)
            self._asked[id(proposal)] = label
            return proposal
        if self._asked and hasattr(self.inner, "observe_opening"):  # it weighs them: told first
            return WAIT
        return self.inner.ask()

    def tell(self, proposal: Proposal, outcome: Outcome) -> str | None:
        label = self._asked.pop(id(proposal), None)
        if label is None:
            return self.inner.tell(proposal, outcome)
        latency, reference = outcome.metrics.get("latency_ms"), self.inner.baseline.get("latency_ms")
        self.scores[label] = {
            "meets": None if outcome.meets is None else float(outcome.meets),
            "latency_ratio": round(latency / reference, 4) if latency and reference else None,
        }
        timed = self.inner.problem.latency_ratio
        if outcome.meets and timed is not None and not self._out_of_time():  # interleaved with the original
            paired = timed(proposal.point, tuple(proposal.flow or ()))
            self.scores[label]["paired_ratio"] = None if paired is None else round(paired, 4)
        if hasattr(self.inner, "observe_opening"):
            self.inner.observe_opening(label, outcome, self.scores[label].get("paired_ratio"))
        return None

    def _won(self) -> bool:
        """Whether an original on another provider met the criterion (then it is a candidate)."""
        return any(score.get("meets") for score in self.scores.values())

    def answer(self) -> int | None:
        return None if self._won() else self.inner.answer()

    def learned(self) -> dict[str, Any]:
        learned = dict(self.inner.learned())
        if self.scores:
            learned["provider_originals"] = self.scores
        return learned
