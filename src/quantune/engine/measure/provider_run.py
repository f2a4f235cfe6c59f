"""``target.providers`` during a run: the originals on each provider first, and what the run says at the end. Apart from
``plan/providers.py`` because these parts reach the backend and trial runner, which the plan must not import."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quantune.config import LoadedConfig
from quantune.engine.plan.providers import provider_step, with_provider_axis
from quantune.engine.plan.step import FLOW
from quantune.engine.trials.target import target_backend
from quantune.evaluate.backend import Backend
from quantune.strategy.base import Proposal, Strategy
from quantune.strategy.openings import STAGE, WithOpenings

log = logging.getLogger("quantune.providers")

__all__ = ["described", "expand_providers", "finish_providers", "with_openings"]


def with_openings(strategy: Strategy, plan: Any, deadline: Any = None) -> Strategy:
    """``strategy`` that first proposes the original on each other provider, when the plan searches providers."""
    step_id = provider_step(plan.steps)
    if step_id is None:
        return strategy
    param = plan.step_params[step_id].get(f"{step_id}.provider")
    values = list(param.choices) if param is not None else [plan.steps[step_id].fixed.get("provider")]
    openings = []
    for provider in values:
        point = {f"{step_id}.provider": provider, **({FLOW: step_id} if len(plan.flows) > 1 else {})}
        if plan.is_runnable(point, (step_id,)):
            openings.append((provider, Proposal(point, (step_id,), stage=f"{STAGE} on {provider}")))
    return WithOpenings(strategy, openings, deadline) if openings else strategy


def described(backend: Backend, config: Any, skipped: Mapping[str, str]) -> dict[str, Any]:
    """results.json's ``target``: the backend's description, with the providers searched and those skipped."""
    described = backend.describe()
    if config.target.providers is not None:
        described |= {"providers": list(config.target.providers), "providers_skipped": dict(skipped)}
    described["threads"] = config.target.threads or config.evaluation.latency.threads
    return described


def finish_providers(result: Any, parts: Any, config: Any, skipped: Mapping[str, str], end: Any = None) -> bool:
    """After the verdict: results.json's ``target``, and the winning pair's session settings searched; whether they
    were."""
    evaluator = parts.context.evaluator
    result.target = described(evaluator.backend, config, skipped)
    best = result.best
    if config.target.providers is None or best is None:
        return False
    reference = config.target.provider
    where = (best.session_settings or {}).get("provider") or reference
    reason = result.verdict_reason.replace(f"trial {best.number} ", f"trial {best.number} on {where} ", 1)
    result.verdict_reason = reason.replace("than the original", f"than the original on {reference}", 1)
    if not result.improved or not best.model_path or not Path(best.model_path).is_file():
        return False
    from quantune.engine.measure.session_search import OV, cache_effect, evaluate_settings, search_session
    from quantune.engine.trials.runner import TrialRunner

    own = dict(best.session_settings or {})
    deadline = None
    if end is not None and end.limited:
        left = end.left_s() - end.end_s - end.report_s
        if left <= 0:
            note = f"no time left within stop.timeout_s ({end.timeout_s:g} s) after the results' reserve"
            log.info("session settings search skipped: %s", note)
            result.target["session_search"] = {"trial": best.number, "settings": own, "skipped": note}
            return False
        deadline = time.perf_counter() + left
    try:
        found = search_session(evaluator, Path(best.model_path), own, where, deadline=deadline)
        if found["settings"] != own:
            reference_outputs = TrialRunner(parts.context).reference()
            figures = evaluate_settings(evaluator, Path(best.model_path), found["settings"], reference_outputs)
            metric = config.evaluation.metric
            check = parts.criterion.check(result.baseline[metric], figures[metric])
            found |= {metric: figures.get(metric), "meets_criterion": check.meets}
            if not check.meets:  # a precision hint that costs accuracy: the settings as measured stay
                found["settings"] = own
    except Exception as exc:  # the search is a refinement: the measured settings stay
        log.warning("session settings search failed: %s", " ".join(str(exc).split())[:300])
        found = {"settings": own, "error": " ".join(str(exc).split())[:300]}
    if where == OV and (deadline is None or time.perf_counter() < deadline):  # what the cache saves at start
        try:
            found["cache"] = cache_effect(evaluator, Path(best.model_path), found["settings"], deadline)
        except Exception as exc:  # a refinement of what to deploy: without it, no cache is deployed
            log.warning("OpenVINO model cache not measured: %s", " ".join(str(exc).split())[:300])
    result.target["session_search"] = {"trial": best.number, **found}
    return True


def expand_providers(loaded: LoadedConfig) -> tuple[LoadedConfig, dict[str, str]]:
    """The run's config with the provider axis wired in (the target is asked only when the config searches it)."""
    if loaded.config.target.providers is None:
        return loaded, {}
    return with_provider_axis(loaded, target_backend(loaded))
