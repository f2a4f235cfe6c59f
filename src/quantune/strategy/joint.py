"""Joint search: one sampler over the whole space (every flow, every pass parameter)."""

from __future__ import annotations

from quantune.strategy.base import Outcome, Proposal, SearchProblem, Strategy
from quantune.strategy.options import StrategyOptions
from quantune.strategy.registry import register_strategy


@register_strategy("joint")
class JointStrategy(Strategy):
    name = "joint"
    Options = StrategyOptions

    def bind(self, problem: SearchProblem) -> None:
        super().bind(problem)
        self.sampler = problem.make_sampler()
        self.sampler.bind(problem.space)

    def ask(self) -> Proposal | None:
        point = self.sampler.ask()
        return None if point is None else Proposal(point, stage="joint")

    def tell(self, proposal: Proposal, outcome: Outcome) -> None:
        self.sampler.tell(proposal.point, outcome.feedback())
