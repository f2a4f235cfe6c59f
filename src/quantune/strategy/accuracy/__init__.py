"""Accuracy-driven strategies: which operators stay in higher precision, and how to find out fast. Each tunes a flow's
quantizing step through the parameters its pass's ``knobs`` trait names."""

from __future__ import annotations

from quantune.strategy.accuracy.bisect import Bisection, minimal_k
from quantune.strategy.accuracy.context import AccuracyContext
from quantune.strategy.accuracy.fallback import (
    AutoStrategy,
    BasicStrategy,
    ConservativeStrategy,
    MSEStrategy,
    MSEv2Strategy,
)
from quantune.strategy.accuracy.quantune import QuantuneStrategy
from quantune.strategy.accuracy.staged import StagedStrategy, Tried
from quantune.strategy.accuracy.two_stage import TwoStageStrategy

__all__ = [
    "AccuracyContext",
    "AutoStrategy",
    "BasicStrategy",
    "Bisection",
    "ConservativeStrategy",
    "MSEStrategy",
    "MSEv2Strategy",
    "QuantuneStrategy",
    "StagedStrategy",
    "Tried",
    "TwoStageStrategy",
    "minimal_k",
]
