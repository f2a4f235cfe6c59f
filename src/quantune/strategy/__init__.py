"""Strategies: tuning procedures built on samplers (joint, pass-by-pass, chains of groups).

A sampler proposes points of one space; a strategy decides which spaces to search, in which
order, and what to carry from one stage to the next. The engine talks only to strategies.
"""

from __future__ import annotations

from quantune.strategy import accuracy  # noqa: F401 - registers basic, conservative, auto, mse, mse_v2, ...
from quantune.strategy.base import WAIT, Outcome, Proposal, SearchProblem, Strategy
from quantune.strategy.joint import JointStrategy
from quantune.strategy.pass_by_pass import PassByPassStrategy
from quantune.strategy.registry import create_strategy, register_strategy, strategy_names

__all__ = [
    "WAIT",
    "JointStrategy",
    "Outcome",
    "PassByPassStrategy",
    "Proposal",
    "SearchProblem",
    "Strategy",
    "create_strategy",
    "register_strategy",
    "strategy_names",
]
