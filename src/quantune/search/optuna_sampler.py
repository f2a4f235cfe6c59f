"""Optuna samplers (TPE and friends) driven through Optuna's ask/tell API.

Each quantune parameter becomes an Optuna categorical over the *indices* of its choices, so
any value (lists, None) can be searched. A conditional parameter is registered under a name
that includes its parents' values, because Optuna requires one distribution per name.
Accuracy misses are passed to Optuna as constraint violations, so constrained TPE learns to
avoid them instead of treating them as merely slow.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import optuna

from quantune.search.base import Feedback, Sampler
from quantune.search.registry import register_sampler
from quantune.space import Point, SearchSpace, point_key

_VIOLATION = "quantune_violation"
# Optuna 5 records constraints on the trial; older releases ask the sampler for a callback.
_NATIVE_CONSTRAINTS = hasattr(optuna.trial.Trial, "set_constraint")


def _violation(trial: optuna.trial.FrozenTrial) -> tuple[float]:
    return (float(trial.user_attrs.get(_VIOLATION, 0.0)),)


def _set_violation(trial: optuna.trial.Trial, value: float) -> None:
    if _NATIVE_CONSTRAINTS:
        trial.set_constraint(_VIOLATION, value)
    else:
        trial.set_user_attr(_VIOLATION, value)


def constraint_options() -> dict[str, Any]:
    """Sampler keyword arguments that make an Optuna sampler honour quantune's violations."""
    return {} if _NATIVE_CONSTRAINTS else {"constraints_func": _violation}


class OptunaSampler(Sampler):
    """Adapts an ``optuna.samplers.BaseSampler`` to quantune's ask/tell interface."""

    name = "optuna"
    max_duplicate_asks = 50

    def __init__(self, seed: int | None = 0) -> None:
        super().__init__(seed)
        self._pending: dict[str, list[optuna.trial.Trial]] = {}
        self._seen: set[str] = set()

    def make_optuna_sampler(self) -> optuna.samplers.BaseSampler:
        raise NotImplementedError

    def bind(self, space: SearchSpace) -> None:
        super().bind(space)
        optuna.logging.set_verbosity(logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        self._study = optuna.create_study(direction="minimize", sampler=self.make_optuna_sampler())
        self._size = space.raw_size()

    def ask(self) -> Point | None:
        space = self._require_space()
        for _ in range(self.max_duplicate_asks):
            if len(self._seen) >= self._size:
                return None
            trial = self._study.ask()
            point = self._suggest(trial, space)
            key = point_key(point)
            if not space.is_valid(point):
                _set_violation(trial, 1.0)
                self._study.tell(trial, state=optuna.trial.TrialState.FAIL)
                self._seen.add(key)
                continue
            if key in self._seen:
                # Optuna proposed a point it already has a score for: tell it nothing new and ask again.
                self._study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            self._seen.add(key)
            self._pending.setdefault(key, []).append(trial)
            return point
        return None

    def tell(self, point: Point, feedback: Feedback) -> None:
        trials = self._pending.get(point_key(point))
        if not trials:
            return
        trial = trials.pop(0)
        if feedback.failed:
            self._study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return
        _set_violation(trial, float(feedback.violation))
        self._study.tell(trial, float(feedback.objective))

    @staticmethod
    def _suggest(trial: optuna.trial.Trial, space: SearchSpace) -> Point:
        point: Point = {}
        for name, param in space.params.items():
            choices = param.choices_given(point)
            if not choices:
                continue
            label = name
            if param.parents:
                label += "|" + ",".join(f"{parent}={point[parent]!r}" for parent in param.parents)
            index = trial.suggest_categorical(label, list(range(len(choices))))
            point[name] = choices[index]
        return point


@register_sampler("tpe")
class TPESampler(OptunaSampler):
    """Tree-structured Parzen Estimator with Optuna's constraint handling for accuracy misses."""

    name = "tpe"

    def __init__(self, seed: int | None = 0, n_startup_trials: int = 5, **options: Any) -> None:
        super().__init__(seed)
        self._options = {"n_startup_trials": n_startup_trials, **options}

    def make_optuna_sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.TPESampler(
            seed=self.seed, multivariate=True, group=True, **constraint_options(), **self._options
        )
