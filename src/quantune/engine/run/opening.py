"""The run's opening: from the loaded config to its parts, identity and strategy, then a claimed output folder. Config
mistakes surface before the folder is claimed."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from quantune import progress
from quantune.config import Config, LoadedConfig
from quantune.engine.executors import WorkerSpec
from quantune.engine.executors.contexts import check_main_importable
from quantune.engine.executors.factory import eval_threads_for
from quantune.engine.executors.stage import Isolation
from quantune.engine.measure.baseline import cached_figures, original_figures
from quantune.engine.measure.prebuild import Prebuild
from quantune.engine.measure.provider_run import with_openings
from quantune.engine.outcome.output import open_output
from quantune.engine.plan.plan import Plan
from quantune.engine.run.early import EarlyWorkers
from quantune.engine.run.problem import search_problem
from quantune.engine.run.timebook import ORIGINAL, SET_UP, TimeBook
from quantune.engine.trials.identity import fingerprints
from quantune.engine.trials.runner import TrialRunner
from quantune.engine.trials.setup import RunParts, build_run, for_workers, preflight
from quantune.errors import ConfigError
from quantune.forkserver import warm_up
from quantune.space.report import EXACT_LIMIT
from quantune.store import RunStore, cache_key
from quantune.strategy import Strategy, create_strategy

log = logging.getLogger("quantune")


@dataclass
class Opening:
    """What the set-up made: the run's parts, the workers' spec, the bound strategy, and the work started ahead."""

    parts: RunParts
    spec: WorkerSpec
    strategy: Strategy
    prebuild: Prebuild | None
    early: EarlyWorkers

    def close(self) -> None:
        """Stops what was started ahead and the run did not take (a run that ended before its ceilings)."""
        if self.prebuild is not None:
            self.prebuild.cancel()
        self.early.stop()


def run_hash(config: Config, parts: RunParts) -> str:
    """The run's identity: the config and the content of what it names."""
    # Where and how trials run does not change their results, nor do the stop conditions: neither is part of the run's
    # identity, so a run stopped at 8 trials goes on to 16 in the same folder.
    identity = config.model_dump(mode="json", exclude={"executor", "stop"})
    # ... but the content of the model, the data and the scripts the config names is (trials/identity.py).
    config_hash = cache_key("config", identity, fingerprints(parts.context.sources))
    if parts.context.start.sha256 != parts.context.model.sha256:  # trials of another preparation never mix in
        config_hash = cache_key(config_hash, "prepared", parts.context.start.sha256)
    return config_hash


def set_up(loaded: LoadedConfig, isolation: Isolation, early: EarlyWorkers, begun: float) -> Opening:
    """The run's parts, identity and strategy; the ceilings' builds and the early workers started."""
    config = loaded.config
    workers = config.executor.workers
    if not isolation.inline:  # the workers' fork server imports beside the set-up (quantune/forkserver.py)
        check_main_importable()
        warm_up()
    with progress.stage("preparing the model"):  # a heavy model's preparation takes minutes: say so
        parts = build_run(loaded, eval_threads=eval_threads_for(workers))
    log.info("set-up (model, data, preparation): %.1f s", time.perf_counter() - begun)
    config_hash = run_hash(config, parts)
    run_id = uuid.uuid4().hex
    sources = parts.context.sources
    spec = WorkerSpec(for_workers(loaded, parts), config_hash, eval_threads_for(workers), sources, run_id)
    strategy = make_strategy(
        parts, config, isolation, spec
    )  # config mistakes surface before the output folder is claimed
    # so do data the model cannot take and a metric that is not a finite number; the speed-ceiling models are built
    # meanwhile (measure/prebuild.py)
    make = lambda: create_strategy(config.search.strategy)  # noqa: E731
    ray_first = config.executor.kind == "ray"  # the builds ahead go to its nodes (executors/ray_stage.py)
    if ray_first:
        early.start(config.executor, parts, spec)
    prebuild = None
    if cached_figures(TrialRunner(parts.context)) is None:  # else the original takes no time to overlap
        prebuild = Prebuild.start(strategy, make, spec, isolation)
    if not ray_first:
        early.start(config.executor, parts, spec)
    return Opening(parts, spec, strategy, prebuild, early)


def claim_output(opening: Opening, output_dir: Path, restart: bool, isolation: Isolation, book: TimeBook) -> RunStore:
    """The original checked in a stage worker, then the output folder claimed; a failure stops the work ahead."""
    parts = opening.parts
    try:
        # beside the builds ahead: half the cores, a quick timing (timed again before the ceilings)
        beside = opening.prebuild is not None

        def baseline() -> dict[str, float]:
            book.mark(SET_UP)
            figures = original_figures(TrialRunner(parts.context), opening.spec, isolation, beside=beside)[0]
            if opening.prebuild is not None:
                opening.prebuild.original_done()  # its core may build now
            book.mark(ORIGINAL)
            return figures

        preflight(parts, baseline=baseline)
        store = open_output(
            output_dir,
            opening.spec.key,  # the run's identity (run_hash)
            restart=restart,
            protected=[parts.context.model.path],
            sources=parts.context.sources,
            cache=parts.context.cache.root,
        )
        book.mark(SET_UP)
    except BaseException:
        opening.close()
        raise
    return store


def make_strategy(parts: RunParts, config: Config, isolation: Isolation, spec: WorkerSpec | None = None) -> Strategy:
    """The configured strategy (providers first), bound to the run's search problem."""
    check_runnable(parts.plan)
    strategy = with_openings(create_strategy(config.search.strategy), parts.plan, isolation.deadline)  # providers first
    strategy.bind(search_problem(parts, config, isolation, spec))
    return strategy


def check_runnable(plan: Plan) -> None:
    """A space whose every point is pruned is a config mistake; the message says what the passes cannot do."""
    space = plan.space
    if not space.is_finite() or space.raw_size() > EXACT_LIMIT:  # walked to prove a runnable point
        return
    if next(iter(space.iterate()), None) is None:
        passes = {step.pass_cls.name: step.pass_cls.limits for step in plan.steps.values()}
        limits = "; ".join(f"{name} {limit}" for name, limit in passes.items() if limit)
        raise ConfigError(
            "passes: every point of the search space is pruned, so nothing can run: check the fixed "
            "parameters against the pass validators, target.provider, which passes may follow which "
            f"and what the model allows ({limits or 'see each pass'}; prepare: auto raises the opset and makes "
            "weights initializers where it can), and your rules (`quantune space CONFIG` shows the size per flow)"
        )
