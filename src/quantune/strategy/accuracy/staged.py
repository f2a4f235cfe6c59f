"""A strategy written as a plain sequence of stages: each ``yield`` hands over a batch of proposals and receives their
outcomes, in order (``WAIT`` until all are told). Evaluated points are answered from memory."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

from quantune.space import Point, point_key
from quantune.strategy.base import WAIT, Outcome, Proposal, SearchProblem, Strategy

Batch = list[Proposal]
Stages = Generator[Batch, list[Outcome], None]


@dataclass(frozen=True)
class Tried:
    """One evaluated proposal, in the order it was told."""

    stage: str
    point: Point
    outcome: Outcome


class StagedStrategy(Strategy):
    """Base of the accuracy-driven strategies; subclasses implement :meth:`stages`."""

    def bind(self, problem: SearchProblem) -> None:
        super().bind(problem)
        self.memo: dict[str, Outcome] = {}
        self.history: list[Tried] = []
        self.stage_log: list[str] = []  # the stage of every proposal sent to the engine, in order
        self._gen: Stages | None = None
        self._batch: Batch = []
        self._results: list[Outcome | None] = []
        self._next = 0  # index of the next proposal of the batch to hand out
        self._pending: dict[str, list[int]] = {}
        self._done = False
        self.setup()

    def setup(self) -> None:
        """Prepares what the stages need (after ``self.problem`` is set)."""

    @abstractmethod
    def stages(self) -> Stages:
        """Yields batches of proposals; receives each batch's outcomes."""

    # -- ask / tell -----------------------------------------------------------------------------
    def ask(self) -> Proposal | Any | None:
        while not self._done:
            if self._next < len(self._batch):
                index = self._next
                self._next += 1
                proposal = self._batch[index]
                key = point_key(proposal.point)
                if key in self.memo:
                    self._results[index] = self.memo[key]
                    continue
                if key in self._pending:  # the same point twice in one batch: one trial
                    self._pending[key].append(index)
                    continue
                self._pending[key] = [index]
                self.stage_log.append(proposal.stage)
                return proposal
            if self._pending:
                return WAIT
            self._advance()
        return None

    def tell(self, proposal: Proposal, outcome: Outcome) -> str | None:
        key = point_key(proposal.point)
        self.memo[key] = outcome
        self.history.append(Tried(proposal.stage, dict(proposal.point), outcome))
        for index in self._pending.pop(key, []):
            self._results[index] = outcome
        return self.annotate(proposal, outcome)

    def annotate(self, proposal: Proposal, outcome: Outcome) -> str | None:
        """A note for the trial's ``stage`` on what this outcome decides (none by default)."""
        return None

    def _advance(self) -> None:
        try:
            if self._gen is None:
                self._gen = self.stages()
                batch = next(self._gen)
            else:
                results = [r if r is not None else Outcome(None) for r in self._results]
                batch = self._gen.send(results)
        except StopIteration:
            self._done = True
            return
        self._batch = list(batch)
        self._results = [None] * len(self._batch)
        self._next = 0

    # -- what the stages use --------------------------------------------------------------------
    def known(self, point: Mapping[str, Any]) -> Outcome | None:
        return self.memo.get(point_key(point))

    def evaluations(self) -> int:
        """Trials spent: a byte-identical model of an earlier trial is no new evaluation."""
        return sum(1 for tried in self.history if tried.outcome.duplicate_of is None)

    def best_meeting(self) -> Tried | None:
        """The told proposal that meets the criterion with the lowest objective."""
        meeting = [t for t in self.history if t.outcome.meets and t.outcome.objective is not None]
        return min(meeting, key=lambda t: t.outcome.objective or 0.0) if meeting else None
