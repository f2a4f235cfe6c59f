"""A run as an Optuna study (``DIR/optuna.journal``), so Optuna's own tools read it as it is.

The journal file, not the SQLite storage, because the RDB storage's imports and schema cost a
large share of a short run's end. Each trial is a frozen trial minimizing the objective and the
accuracy loss, with the budget as a constraint, so Optuna's Pareto plots mark the misses.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quantune.engine.outcome.result import Result
from quantune.engine.trials.trial import TrialRecord

log = logging.getLogger("quantune")

STUDY_NAME = "quantune"
STUDY_FILE = "optuna.journal"
_PLAIN = (str, int, float, bool, type(None))


def journal_storage(path: str | Path) -> Any:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(path)))


def load_run_study(run_dir: str | Path) -> Any:
    """The study a run wrote (``run_dir/optuna.journal``), as ``optuna.load_study`` reads it."""
    import optuna

    return optuna.load_study(study_name=STUDY_NAME, storage=journal_storage(Path(run_dir) / STUDY_FILE))


def write_study(results: Result, run_dir: str | Path, space: Any = None) -> Any:
    """Writes ``run_dir/optuna.journal`` and returns the same study in memory for drawing.

    ``space``: the run's search space (its domains give the distributions); without it, each
    parameter's distribution is made from the values seen.
    """
    import optuna

    optuna.logging.set_verbosity(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    trials = frozen_trials(results, space)
    memory = _study(results, optuna.storages.InMemoryStorage(), trials)
    target = Path(run_dir) / STUDY_FILE
    tmp = target.with_name(f".{STUDY_FILE}.tmp")
    tmp.unlink(missing_ok=True)
    _study(results, journal_storage(tmp), trials)
    os.replace(tmp, target)  # a reader never sees a half-written study
    (Path(run_dir) / "optuna.db").unlink(missing_ok=True)  # an earlier version's study of this folder: stale
    return memory


def _study(results: Result, storage: Any, trials: list[Any]) -> Any:
    import optuna

    study = optuna.create_study(study_name=STUDY_NAME, storage=storage, directions=["minimize", "minimize"])
    study.set_metric_names([objective_name(results), "accuracy loss"])
    attrs = {"metric": results.metric, "criterion": results.criterion.to_json(), "verdict": results.verdict}
    for key, value in {**attrs, "verdict_reason": results.verdict_reason, "baseline": results.baseline}.items():
        study.set_user_attr(key, value)
    study.add_trials(trials)
    return study


def objective_name(results: Result) -> str:
    return "size (KB)" if results.objective == "size" else "latency (ms)"


def objective_value(results: Result, metrics: Mapping[str, Any]) -> float | None:
    """The run's objective in the report's units (KB for size), None when not measured."""
    if results.objective == "size":
        value = metrics.get("size_bytes")
        return None if value is None else float(value) / 1024
    value = metrics.get("latency_ms")
    return None if value is None else float(value)


def frozen_trials(results: Result, space: Any = None) -> list[Any]:
    """The run's trials as Optuna ``FrozenTrial`` objects, in trial order."""
    import optuna
    from optuna.trial import TrialState

    trials = sorted(results.trials, key=lambda t: t.number)
    mapped = [_mapped_params(trial.params, space) for trial in trials]
    distributions = _distributions(mapped)
    tolerable = results.criterion.tolerable_loss
    native = "constraints" in inspect.signature(optuna.trial.create_trial).parameters
    out = []
    for trial, params in zip(trials, mapped, strict=True):
        values = {name: dist.to_internal_repr(value) for name, (value, dist) in _fitted(params, distributions).items()}
        used = {name: distributions[name] for name in values}
        params_out = {name: used[name].to_external_repr(internal) for name, internal in values.items()}
        attrs = _user_attrs(trial)
        objective = objective_value(results, trial.metrics)
        loss = trial.accuracy_loss
        ok = trial.status == "ok" and objective is not None and loss is not None
        kwargs: dict[str, Any] = {"params": params_out, "distributions": used, "user_attrs": attrs}
        if ok:
            violation = float(loss) - float(tolerable)
            if native:
                kwargs["constraints"] = {"accuracy_budget": violation}
            else:
                kwargs["system_attrs"] = {"constraints": (violation,)}
            out.append(optuna.trial.create_trial(state=TrialState.COMPLETE, values=[objective, float(loss)], **kwargs))
        else:
            out.append(optuna.trial.create_trial(state=TrialState.FAIL, **kwargs))
    return out


def _user_attrs(trial: TrialRecord) -> dict[str, Any]:
    attrs = {
        "quantune_trial": trial.number,
        "flow": " > ".join(trial.flow),
        "stage": trial.stage,
        "meets_criterion": trial.meets_criterion,
        "failure_class": trial.failure_class,
        "error": (trial.error or "")[:500] or None,
    }
    for key in ("quantized_ops", "quantized_compute_fraction", "size_bytes", "latency_ms"):
        if key in trial.metrics:
            attrs[key] = trial.metrics[key]
    return {k: v for k, v in attrs.items() if v is not None and v != ""}


def _mapped_params(params: Mapping[str, Any], space: Any) -> dict[str, tuple[Any, Any]]:
    """Optuna name -> (value, distribution from the space or None) for one trial's params."""
    from quantune.search._optuna_space import label

    out: dict[str, tuple[Any, Any]] = {}
    context = {**(getattr(space, "fixed", None) or {}), **params}
    for name, value in params.items():
        param = space.params.get(name) if space is not None else None
        if param is None:
            if isinstance(value, list | tuple | dict):
                out[f"{name} (count)"] = (len(value), None)
            else:
                out[name] = (value if isinstance(value, _PLAIN) else _text(value), None)
            continue
        try:
            domain = param.domain_given(context)
            optuna_name = label(name, param, context)
        except (KeyError, TypeError, ValueError):
            domain, optuna_name = None, name
        out[optuna_name] = (value, _distribution(domain))
    return out


def _distribution(domain: Any) -> Any:
    import optuna.distributions as d

    from quantune.space import FloatRange, IntRange

    if domain is None:
        return None
    if isinstance(domain, IntRange):
        return d.IntDistribution(domain.low, domain.last, step=1 if domain.log else domain.step, log=domain.log)
    if isinstance(domain, FloatRange):
        high = domain.high if domain.step is None else domain.last
        return d.FloatDistribution(domain.low, high, step=None if domain.log else domain.step, log=domain.log)
    try:
        return d.CategoricalDistribution(_unique([_choice(v) for v in domain.choices_given({})]))
    except (AttributeError, TypeError, ValueError):
        return None


def _distributions(mapped: list[dict[str, tuple[Any, Any]]]) -> dict[str, Any]:
    """One distribution per Optuna name: the space's when every value fits it, else one from the values seen."""
    import optuna.distributions as d

    seen: dict[str, list[tuple[Any, Any]]] = {}
    for params in mapped:
        for name, entry in params.items():
            seen.setdefault(name, []).append(entry)
    out: dict[str, Any] = {}
    for name, entries in seen.items():
        first = entries[0][1]
        if first is not None and all(dist == first and _fits(first, value) for value, dist in entries):
            out[name] = first
            continue
        values = [value for value, _ in entries]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            out[name] = d.IntDistribution(min(values), max(values))
        elif all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            out[name] = d.FloatDistribution(float(min(values)), float(max(values)))
        else:
            out[name] = d.CategoricalDistribution(_unique([_choice(v) for v in values]))
    return out


def _fitted(params: dict[str, tuple[Any, Any]], distributions: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Each value in the form its distribution holds (a categorical's choice, a float for a float range)."""
    import optuna.distributions as d

    out = {}
    for name, (value, _) in params.items():
        dist = distributions[name]
        if isinstance(dist, d.CategoricalDistribution):
            value = _choice(value)
        elif isinstance(dist, d.FloatDistribution):
            value = float(value)
        out[name] = (value, dist)
    return out


def _fits(dist: Any, value: Any) -> bool:
    import optuna.distributions as d

    if isinstance(dist, d.CategoricalDistribution):
        return _choice(value) in dist.choices
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return dist.low <= value <= dist.high


def _choice(value: Any) -> Any:
    """A value as an Optuna categorical choice (None, bool, int, float or str)."""
    return value if isinstance(value, _PLAIN) else _text(value)


def _text(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(value)


def _unique(values: list[Any]) -> tuple[Any, ...]:
    out: list[Any] = []
    for value in values:
        if not any(type(value) is type(o) and value == o for o in out):
            out.append(value)
    return tuple(out)


def run_space(run_dir: str | Path) -> Any:
    """The run's search space, rebuilt from its ``config.json`` (None when it cannot be)."""
    try:
        from quantune.config import Config
        from quantune.engine.plan.plan import build_plan

        config = Config.model_validate(json.loads((Path(run_dir) / "config.json").read_text()))
        return build_plan(config).space
    except Exception as exc:  # an old or foreign config: distributions from the values seen
        log.debug("report: no search space from config.json (%s)", exc)
        return None
