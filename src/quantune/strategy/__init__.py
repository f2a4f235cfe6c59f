"""Strategies: tuning procedures built on samplers (joint, pass-by-pass, chains of groups).

A sampler proposes points of one space; a strategy decides which spaces to search, in which
order, and what to carry from one stage to the next. The engine talks only to strategies.
"""

from __future__ import annotations

from quantune.strategy import accuracy, joint, pass_by_pass  # noqa: F401 - registers the strategies
from quantune.strategy.base import WAIT, Outcome, Proposal, SearchProblem, Strategy
from quantune.strategy.registry import create_strategy, register_strategy, strategy_names

__all__ = [
    "WAIT",
    "Outcome",
    "Proposal",
    "SearchProblem",
    "Strategy",
    "create_strategy",
    "register_strategy",
    "strategy_names",
]
