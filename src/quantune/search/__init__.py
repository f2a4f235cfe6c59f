"""Samplers behind one ask/tell interface, and a registry that finds them by name."""

from __future__ import annotations

from quantune.search.base import Feedback, Sampler
from quantune.search.exhaustive import ExhaustiveSampler
from quantune.search.optuna_sampler import OptunaSampler, TPESampler
from quantune.search.random_sampler import RandomSampler
from quantune.search.registry import create_sampler, register_sampler, sampler_names

__all__ = [
    "ExhaustiveSampler",
    "Feedback",
    "OptunaSampler",
    "RandomSampler",
    "Sampler",
    "TPESampler",
    "create_sampler",
    "register_sampler",
    "sampler_names",
]
