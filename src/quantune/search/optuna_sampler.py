"""Optuna's samplers (TPE, CMA-ES, GP, QMC, NSGA-II) driven through Optuna's ask/tell API.

:class:`OptunaSampler` adapts any ``optuna.samplers.BaseSampler``; each registered subclass
below only says which one to build. How parameters map to Optuna's suggestions (ranges as
numbers, categoricals and joints as indices, conditionals named by their parents' values) is
in :mod:`quantune.search._optuna_space`.

Accuracy misses are told as constraint violations, so samplers that model constraints learn to
avoid them. Failed trials are told as the worst of all, not as Optuna's ``FAIL`` (which the
samplers leave out of their models, so they would propose the failing region again); a failure
told before any trial has a value waits until there is one to compare. No Optuna sampler reads
weights: the adapter enqueues a first trial of every parameter's highest-weight value.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import math
import random
import warnings
from collections.abc import Sequence
from typing import Any

import optuna

from quantune.errors import QuantuneError
from quantune.search._optuna_space import optuna_params, priority_params, suggest_point
from quantune.search.base import Feedback, Sampler
from quantune.search.registry import register_sampler
from quantune.search.unseen import UnseenPoints
from quantune.space import Point, SearchSpace, point_key

_VIOLATION = "quantune_violation"
# Optuna 5 records constraints on the trial; older releases ask the sampler for a callback.
_NATIVE_CONSTRAINTS = hasattr(optuna.trial.Trial, "set_constraint")
_DIRECTIONS = ("minimize", "maximize")


def _violation(trial: optuna.trial.FrozenTrial) -> tuple[float]:
    return (float(trial.user_attrs.get(_VIOLATION, 0.0)),)


def _set_violation(trial: optuna.trial.Trial, value: float) -> None:
    if _NATIVE_CONSTRAINTS:
        trial.set_constraint(_VIOLATION, value)
    else:
        trial.set_user_attr(_VIOLATION, value)


def constraint_options(sampler_cls: type[optuna.samplers.BaseSampler] | None = None) -> dict[str, Any]:
    """Keyword arguments that make an Optuna sampler honour quantune's violations (none on Optuna 5)."""
    if _NATIVE_CONSTRAINTS:
        return {}
    if sampler_cls is not None and "constraints_func" not in inspect.signature(sampler_cls).parameters:
        return {}
    return {"constraints_func": _violation}


def _require(module: str, sampler: str, extra: str, package: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise QuantuneError(
            f"search.sampler: '{sampler}' needs the '{package}' package, which is not installed; "
            f"install it with: pip install 'quantune[{extra}]' (or: pip install {package})"
        )


class OptunaSampler(Sampler):
    """Adapts ``optuna.samplers.<optuna_name>`` to quantune's ask/tell interface.

    ``directions`` (``minimize`` / ``maximize`` per objective) makes the study multi-objective;
    ``options`` go to Optuna's sampler over the subclass's ``defaults``.
    """

    name = "optuna"
    max_duplicate_asks = 20
    multi_objective = True
    uses_constraints = True  # False where Optuna's sampler ignores constraints (and warns when given them)
    optuna_name = ""
    defaults: dict[str, Any] = {}

    def __init__(self, seed: int | None = 0, directions: Sequence[str] | None = None, **options: Any) -> None:
        super().__init__(seed)
        self._options = {**self.defaults, **options}
        self.directions = tuple(directions or ("minimize",))
        bad = [d for d in self.directions if d not in _DIRECTIONS]
        if bad or isinstance(directions, str):
            raise QuantuneError(f"search.directions: {list(self.directions)!r}; give a list of {list(_DIRECTIONS)}")
        if len(self.directions) > 1 and not self.multi_objective:
            raise QuantuneError(f"search.sampler: '{self.name}' optimizes one objective; got {len(self.directions)}")

    def make_optuna_sampler(self) -> optuna.samplers.BaseSampler:
        cls = getattr(optuna.samplers, self.optuna_name)
        constraints = constraint_options(cls) if self.uses_constraints else {}
        # The warning switch is newer than some supported Optuna releases: left out where unknown.
        known = inspect.signature(cls).parameters
        options = {k: v for k, v in self._options.items() if k in known or k != "warn_independent_sampling"}
        return cls(seed=self.seed, **constraints, **options)

    def bind(self, space: SearchSpace) -> None:
        super().bind(space)
        optuna.logging.set_verbosity(logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        self._pending: dict[str, list[optuna.trial.Trial]] = {}
        self._seen: set[str] = set()
        self._unseen = UnseenPoints(space, random.Random(self.seed), self._seen)
        self._patience = self.max_duplicate_asks
        self._study = optuna.create_study(directions=list(self.directions), sampler=self.make_optuna_sampler())
        self._worst: list[float] | None = None  # per objective, the worst value told so far
        self._worst_violation = 0.0
        self._deferred: list[optuna.trial.Trial] = []  # failures told before any value was known
        first = priority_params(space)
        if first:
            self._study.enqueue_trial(first)

    def ask(self) -> Point | None:
        space = self._require_space()
        for _ in range(self._patience):
            if len(self._seen) >= self._unseen.size:
                return None
            trial = self._study.ask()
            point = suggest_point(trial, space)
            key = point_key(point)
            if not space.is_valid(point):
                self._constrain(trial, 1.0)
                self._study.tell(trial, state=optuna.trial.TrialState.FAIL)
                self._seen.add(key)
                continue
            if key in self._seen:
                # Optuna proposed a point it already has a score for: tell it nothing new and ask again.
                self._study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            self._patience = min(self.max_duplicate_asks, 2 * self._patience)
            return self._accept(trial, point, key)
        # Optuna keeps proposing points it cannot use (TPE may return to an invalid point forever):
        # hand it an unseen valid point as a trial it can learn from. Patience halves meanwhile (and
        # doubles back), so a saturated search does not pay for many wasted asks per point.
        self._patience = max(1, self._patience // 2)
        point = self._unseen.next()
        if point is None:
            return None
        self._study.enqueue_trial(optuna_params(point, space))
        trial = self._study.ask()
        point = suggest_point(trial, space)
        return self._accept(trial, point, point_key(point))

    def _accept(self, trial: optuna.trial.Trial, point: Point, key: str) -> Point:
        self._seen.add(key)
        self._pending.setdefault(key, []).append(trial)
        return point

    def tell(self, point: Point, feedback: Feedback) -> None:
        trials = self._pending.get(point_key(point))
        if not trials:
            return
        values = feedback.values()
        if values is not None and len(self.directions) == 1 and len(values) > 1:
            values = values[:1]  # a single-objective study of a multi-objective run: the first objective
        if values is not None and len(values) != len(self.directions):
            raise ValueError(
                f"{self.name}: the study has {len(self.directions)} objective(s) {list(self.directions)}, "
                f"the feedback gives {len(values)}"
            )
        trial = trials.pop(0)
        if math.isnan(float(feedback.violation)):  # Optuna refuses a NaN constraint: a failed trial
            values = None
        if values is None:
            if self._worst is None:
                self._deferred.append(trial)
            else:
                self._tell_failed(trial)
            return
        self._remember_worst(values, float(feedback.violation))
        self._constrain(trial, float(feedback.violation))
        self._study.tell(trial, values[0] if len(values) == 1 else list(values))
        deferred, self._deferred = self._deferred, []
        for waiting in deferred:
            self._tell_failed(waiting)

    def _remember_worst(self, values: tuple[float, ...], violation: float) -> None:
        self._worst_violation = max(self._worst_violation, violation)
        if self._worst is None:
            self._worst = list(values)
            return
        for index, (value, direction) in enumerate(zip(values, self.directions, strict=True)):
            worse = max if direction == "minimize" else min
            self._worst[index] = worse(self._worst[index], value)

    def _tell_failed(self, trial: optuna.trial.Trial) -> None:
        """A failed trial as the worst of all: beyond the worst value, and infeasible."""
        assert self._worst is not None
        penalty = [
            value + (0.1 * max(abs(value), 1e-9)) * (1 if direction == "minimize" else -1)
            for value, direction in zip(self._worst, self.directions, strict=True)
        ]
        self._constrain(trial, max(1.0, 2 * self._worst_violation))
        self._study.tell(trial, penalty[0] if len(penalty) == 1 else penalty)

    def _constrain(self, trial: optuna.trial.Trial, violation: float) -> None:
        if self.uses_constraints:
            _set_violation(trial, violation)

    @property
    def study(self) -> optuna.Study:
        """The underlying Optuna study (for inspection: trials, Pareto front)."""
        return self._study


@register_sampler("tpe")
class TPESampler(OptunaSampler):
    """Tree-structured Parzen Estimator (multivariate, grouped for conditionals) with constraints."""

    name = "tpe"
    optuna_name = "TPESampler"
    defaults = {"n_startup_trials": 5, "multivariate": True, "group": True}


@register_sampler("cmaes")
class CmaEsSampler(OptunaSampler):
    """CMA-ES over the numeric parameters; single objective; needs the ``cmaes`` package.

    It models only the ranges active in every point; the other parameters fall back to seeded
    random sampling, and it ignores accuracy violations (Optuna's CMA-ES has no constraints).
    """

    name = "cmaes"
    optuna_name = "CmaEsSampler"
    defaults = {"warn_independent_sampling": False}
    multi_objective = False
    uses_constraints = False

    def __init__(self, seed: int | None = 0, directions: Sequence[str] | None = None, **options: Any) -> None:
        super().__init__(seed, directions, **options)
        _require("cmaes", self.name, "cmaes", "cmaes")


@register_sampler("gp")
class GPSampler(OptunaSampler):
    """Gaussian-process Bayesian optimisation (Optuna's ``GPSampler``); needs PyTorch.

    Best on few numeric parameters and expensive trials; conditional ones are sampled independently.
    """

    name = "gp"
    optuna_name = "GPSampler"
    defaults = {"n_startup_trials": 10, "warn_independent_sampling": False}

    def __init__(self, seed: int | None = 0, directions: Sequence[str] | None = None, **options: Any) -> None:
        super().__init__(seed, directions, **options)
        if not hasattr(optuna.samplers, "GPSampler"):
            raise QuantuneError(f"search.sampler: 'gp' needs optuna>=3.6; this is optuna {optuna.__version__}")
        _require("torch", self.name, "gp", "torch")


@register_sampler("qmc")
class QMCSampler(OptunaSampler):
    """Quasi-Monte Carlo (scrambled Sobol by default): spreads points evenly, learns nothing.

    Scrambling makes the sequence depend on the seed; conditionals are sampled independently.
    """

    name = "qmc"
    optuna_name = "QMCSampler"
    defaults = {"qmc_type": "sobol", "scramble": True, "warn_independent_sampling": False}
    uses_constraints = False


@register_sampler("nsga2")
class NSGAIISampler(OptunaSampler):
    """NSGA-II, the genetic algorithm for several objectives (e.g. latency and size), with constraints.

    ``population_size`` defaults to 20, not Optuna's 50: runs last tens of trials, and the first
    generation is random.
    """

    name = "nsga2"
    optuna_name = "NSGAIISampler"
    defaults = {"population_size": 20}
