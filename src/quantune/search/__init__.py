"""Samplers behind one ask/tell interface, and a registry that finds them by name.

Built in: ``exhaustive``, ``random``, and through Optuna ``tpe``, ``cmaes`` (needs the
``cmaes`` package), ``gp`` (needs PyTorch), ``qmc`` and ``nsga2`` (several objectives).
Plugins register with :func:`register_sampler` or the ``quantune.samplers`` entry point group.
"""

from __future__ import annotations

from quantune.search import optuna_sampler  # noqa: F401 - registers the Optuna samplers
from quantune.search.base import Feedback, Sampler
from quantune.search.exhaustive import ExhaustiveSampler
from quantune.search.random_sampler import RandomSampler
from quantune.search.registry import create_sampler, get_sampler, register_sampler, sampler_names

__all__ = [
    "ExhaustiveSampler",
    "Feedback",
    "RandomSampler",
    "Sampler",
    "create_sampler",
    "get_sampler",
    "register_sampler",
    "sampler_names",
]
