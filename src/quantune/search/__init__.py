"""Samplers behind one ask/tell interface, and a registry that finds them by name.

Built in: ``exhaustive``, ``random``, and through Optuna ``tpe``, ``cmaes`` (needs the
``cmaes`` package), ``gp`` (needs PyTorch), ``qmc`` and ``nsga2`` (several objectives).
Plugins register with :func:`register_sampler` or the ``quantune.samplers`` entry point group.
"""

from __future__ import annotations

from quantune.search.base import Feedback, Sampler
from quantune.search.exhaustive import ExhaustiveSampler
from quantune.search.optuna_sampler import (
    CmaEsSampler,
    GPSampler,
    NSGAIISampler,
    OptunaSampler,
    QMCSampler,
    TPESampler,
)
from quantune.search.random_sampler import RandomSampler
from quantune.search.registry import ENTRY_POINT_GROUP, create_sampler, get_sampler, register_sampler, sampler_names

__all__ = [
    "ENTRY_POINT_GROUP",
    "CmaEsSampler",
    "ExhaustiveSampler",
    "Feedback",
    "GPSampler",
    "NSGAIISampler",
    "OptunaSampler",
    "QMCSampler",
    "RandomSampler",
    "Sampler",
    "TPESampler",
    "create_sampler",
    "get_sampler",
    "register_sampler",
    "sampler_names",
]
