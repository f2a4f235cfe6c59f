"""Pass-by-pass and chains of groups (the Olive design's execution orders).

The flow is cut into groups (one pass each for ``pass-by-pass``; ``search.groups`` for
``chain``, e.g. ``A -> [B, C] -> D``). Group k is searched with a fresh sampler over its own
parameters, running the flow up to its last step, on top of one of the best outputs kept
from group k-1. When a group finds no output that meets the criterion, the search backtracks
to the next-best output of the group before it; when every kept output is used up, the
group before that backtracks in turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quantune.errors import QuantuneError
from quantune.search import Sampler
from quantune.space import Point, point_key
from quantune.strategy.base import WAIT, Outcome, Proposal, SearchProblem, Strategy
from quantune.strategy.options import StrategyOptions
from quantune.strategy.registry import register_strategy


@dataclass
class _Stage:
    """One group searched on top of one prefix (the chosen values of the earlier groups)."""

    index: int
    prefix: Point
    sampler: Sampler
    asked: int = 0
    pending: int = 0
    exhausted: bool = False
    results: list[tuple[float, int, Point]] = field(default_factory=list)  # (objective, order, full point)


@register_strategy("pass-by-pass")
class PassByPassStrategy(Strategy):
    name = "pass-by-pass"
    Options = StrategyOptions
    requires_groups = False

    def bind(self, problem: SearchProblem) -> None:
        super().bind(problem)
        if len(problem.flows) != 1:
            raise QuantuneError(
                f"search.strategy: '{self.name}' searches one flow; the config has {len(problem.flows)}"
            )
        flow = next(iter(problem.flows.values()))
        if problem.groups:
            groups = [list(group) for group in problem.groups]
            listed = [step for group in groups for step in group]
            if listed != list(flow):
                raise QuantuneError(f"search.groups: must list the flow's steps {list(flow)} in order, got {listed}")
        elif self.requires_groups:
            raise QuantuneError("search.groups: the chain strategy needs groups, e.g. [[A], [B, C], [D]]")
        else:
            groups = [[step] for step in flow]
        self.groups = groups
        per_group = problem.trials_per_group
        if per_group is None and problem.max_trials is not None:
            per_group = max(1, problem.max_trials // len(groups))
        self.per_group = per_group
        # For each group, the kept outputs not yet tried as a prefix for the next group (best first).
        self.backlog: list[list[Point]] = [[] for _ in groups]
        self.stage: _Stage | None = self._open(0, {})
        self.order = 0

    def _steps_through(self, index: int) -> tuple[str, ...]:
        return tuple(step for group in self.groups[: index + 1] for step in group)

    def _open(self, index: int, prefix: Point) -> _Stage:
        sampler = self.problem.make_sampler()
        sampler.bind(self.problem.subspace(list(self._steps_through(index)), prefix))
        return _Stage(index, dict(prefix), sampler)

    def ask(self) -> Proposal | Any | None:
        while self.stage is not None:
            stage = self.stage
            if not stage.exhausted and (self.per_group is None or stage.asked < self.per_group):
                point = stage.sampler.ask()
                if point is not None:
                    stage.asked += 1
                    stage.pending += 1
                    full = {**stage.prefix, **point}
                    return Proposal(full, flow=self._steps_through(stage.index), stage=f"group {stage.index}")
                stage.exhausted = True
            if stage.pending:
                return WAIT
            self.stage = self._advance(stage)
        return None

    def tell(self, proposal: Proposal, outcome: Outcome) -> None:
        stage = self.stage
        if stage is None:
            return
        local = {k: v for k, v in proposal.point.items() if k not in stage.prefix}
        stage.sampler.tell(local, outcome.feedback())
        stage.pending -= 1
        if outcome.meets and outcome.objective is not None:
            self.order += 1
            stage.results.append((outcome.objective, self.order, dict(proposal.point)))

    def _advance(self, stage: _Stage) -> _Stage | None:
        """Closes ``stage``: continue into the next group from its best output, or backtrack."""
        kept = sorted(stage.results, key=lambda r: (r[0], r[1]))
        unique: dict[str, Point] = {}
        for _, _, point in kept:
            unique.setdefault(point_key(point), point)
        self.backlog[stage.index] = list(unique.values())[: self.problem.keep_best]
        if stage.index == len(self.groups) - 1 and kept:
            return None  # the last group found outputs that meet the criterion: done
        index = stage.index if stage.index < len(self.groups) - 1 else stage.index - 1
        # Find the deepest group with an untried kept output, and continue from it.
        while index >= 0:
            if self.backlog[index]:
                prefix = self.backlog[index].pop(0)
                return self._open(index + 1, prefix)
            index -= 1
        return None


@register_strategy("chain")
class ChainStrategy(PassByPassStrategy):
    name = "chain"
    requires_groups = True
