"""The strategy's view of a run: spaces, flows, a sampler factory, limits and model facts. Built outside the engine
because it wires what the engine must not know: the sampler's own options and the accuracy strategies' probes."""

from __future__ import annotations

from typing import Any

from quantune.config import Config
from quantune.engine.executors.stage import Isolation
from quantune.engine.measure.prebuild import enabled as prebuild_enabled
from quantune.engine.measure.probes import accuracy_fields  # model facts, probes, strategy options
from quantune.engine.measure.stages import isolated
from quantune.engine.trials.setup import RunParts
from quantune.machine import int8_saturates
from quantune.search import create_sampler
from quantune.search.directions import sampler_directions
from quantune.strategy import SearchProblem
from quantune.strategy.registry import checked_options


def search_problem(
    parts: RunParts, config: Config, isolation: Isolation | None = None, spec: Any = None
) -> SearchProblem:
    """What the config's strategy may know of this run (accuracy strategies: the model graph and probes too)."""
    search = config.search
    options: dict[str, Any] = {}
    if config.executor.workers > 1 and search.sampler == "tpe":
        options["constant_liar"] = True  # pending trials count as in-progress for TPE
    objectives = tuple(config.objectives or [config.objective])
    options.update(sampler_directions(search.sampler, objectives))
    return SearchProblem(
        space=parts.plan.space,
        flows=parts.plan.flows,
        subspace=parts.plan.subspace,
        make_sampler=lambda: create_sampler(search.sampler, seed=search.seed, **options),
        max_trials=config.stop.max_trials,
        groups=search.groups,
        trials_per_group=search.trials_per_group,
        keep_best=search.keep_best,
        objective=objectives[0],
        objectives=objectives,
        timeout_s=config.stop.timeout_s,
        int8_saturates=int8_saturates(),
        provider=config.target.provider,
        tolerable_loss=parts.criterion.tolerable_loss,
        evaluates_ahead=isolation is not None and not isolation.inline and spec is not None and prebuild_enabled(),
        **isolated(
            accuracy_fields(
                parts.context, parts.plan, checked_options(search.strategy, search.strategy_options), isolation
            ),
            isolation,
            spec,
            local=(parts.context, parts.plan),
        ),
    )
