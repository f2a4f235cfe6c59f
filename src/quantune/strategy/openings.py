"""Proposals every strategy runs first: the original on each execution provider (``target.providers``).

The provider alone can move latency as much as quantization does, with no accuracy lost. So before any strategy searches quantization, the original is evaluated
on every other provider -- accuracy and latency, on that provider -- and is a candidate like
any other (a lossless speed-up is a valid ``improved``). The wrapped strategy never sees these
trials (its sampler's space and stages are its own); what they scored, and their latency timed
interleaved with the original's (the engine's ``latency_ratio`` probe: a paired ratio), is what
it learned (``learned()["provider_originals"]``); the end-of-run re-timing and the verdict weigh
them against every quantized candidate side by side. A strategy that weighs them (the quantune
strategy's ceiling stage drops the quantized ceilings an original in budget already beats:
``strategy/accuracy/provider_ceilings.py``) is told each one's outcome (its ``observe_opening``),
and is first asked only once every opening was told: the same run then decides the same way with
several workers.
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
        # the openings are part of the search: past ``deadline`` (the engine's ``StageDeadline``,
        # set from stop.timeout_s) those not yet run are skipped with a note, not run after the limit
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
        if (
            outcome.meets and timed is not None and not self._out_of_time()
        ):  # paired: interleaved with the original on its provider
            paired = timed(proposal.point, tuple(proposal.flow or ()))
            self.scores[label]["paired_ratio"] = None if paired is None else round(paired, 4)
        if hasattr(self.inner, "observe_opening"):
            self.inner.observe_opening(label, outcome, self.scores[label].get("paired_ratio"))
        return None

    def _won(self) -> bool:
        """Whether an original on another provider met the criterion (it is then a candidate,
        so the inner strategy's "keep the original" does not stand on its own)."""
        return any(score.get("meets") for score in self.scores.values())

    def answer(self) -> int | None:
        return None if self._won() else self.inner.answer()

    def learned(self) -> dict[str, Any]:
        learned = dict(self.inner.learned())
        if self.scores:
            learned["provider_originals"] = self.scores
        return learned
