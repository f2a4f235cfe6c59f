"""One run from config to result, as a short list of phases, each a function in a module with one job: opening,
original, search_phase, ending, outcome. The engine knows neither ONNX nor Optuna."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from quantune.config import LoadedConfig
from quantune.engine.executors import create_executor
from quantune.engine.executors.stage import Isolation
from quantune.engine.measure.provider_run import expand_providers, finish_providers
from quantune.engine.outcome.output import attach_log, close_output, detach_log
from quantune.engine.outcome.result import Result
from quantune.engine.run.early import EarlyWorkers
from quantune.engine.run.ending import Ending, confirm_end
from quantune.engine.run.loop import RunListener
from quantune.engine.run.opening import Opening, claim_output, set_up
from quantune.engine.run.original import measure_original, tell_baseline
from quantune.engine.run.outcome import gather, write
from quantune.engine.run.resume import Replay
from quantune.engine.run.search_phase import Searched, search
from quantune.engine.run.timebook import CLOSEST_MISS, CONFIRMATION, SESSION_SETTINGS, START_UP, TimeBook
from quantune.engine.trials.identity import check_model_unchanged
from quantune.engine.trials.runner import TrialRunner
from quantune.store import RunStore
from quantune.store.faults import storage_errors

log = logging.getLogger("quantune")


class Engine:
    """Runs one config to its result. ``Engine(loaded_config, output_dir).run()``."""

    def __init__(
        self,
        loaded: LoadedConfig,
        output_dir: Path,
        *,
        restart: bool = False,
        listeners: Sequence[RunListener] = (),
        started: float | None = None,
    ) -> None:
        """``started``: the ``time.perf_counter()`` reading ``stop.timeout_s`` counts from (default: ``run()``)."""
        self.loaded, self.providers_skipped = expand_providers(loaded)  # target.providers: the provider axis
        self.started = started
        self.early = EarlyWorkers()  # workers started before the output was claimed (early.py)
        self.config = self.loaded.config
        self.output_dir = Path(output_dir).resolve()
        self.restart = restart
        self.listeners = list(listeners)
        executor = self.config.executor
        # Heavy stages outside the trials (sensitivity analysis) run in workers under the trials' limits.
        self.isolation = Isolation(
            log_dir=self.output_dir / "workers",
            memory_limit_mb=executor.memory_limit_mb,
            timeout_s=executor.trial_timeout_s,
            inline=executor.kind == "inline",
        )

    @property
    def objectives(self) -> list[str]:
        return list(self.config.objectives or [self.config.objective])

    def run(self) -> Result:
        begun = time.perf_counter()
        started = self.started if self.started is not None else begun  # the limit covers set-up too
        self.book = TimeBook(started)
        self.book.mark(START_UP)
        opening = set_up(self.loaded, self.isolation, self.early, begun)
        store = claim_output(opening, self.output_dir, self.restart, self.isolation, self.book)
        failed = True  # until the run returns: a run that fails with no finished trial leaves nothing behind
        try:
            with storage_errors(self.output_dir, "--output", refused=False):
                (self.output_dir / "config.json").write_text(json.dumps(self.config.model_dump(mode="json"), indent=2))
                handler = attach_log(self.output_dir / "quantune.log")
                try:
                    result = self._run(opening, store, started)
                finally:
                    detach_log(handler)
            failed = False
            return result
        finally:
            opening.close()  # a run that ended before its ceilings: the builds stop; early workers not taken
            close_output(store, failed=failed)

    def _run(self, opening: Opening, store: RunStore, started: float) -> Result:
        """The phases once the output folder is claimed: original, search, confirmation, outcome."""
        parts = opening.parts
        runner = TrialRunner(parts.context)
        runner.criterion = parts.criterion  # an in-process trial judges a miss before timing it (trials/runner.py)
        replay = Replay(store.trials())
        # the workers started with the original's evaluation (their logs come here now), else new ones
        executor = self.early.take(self.output_dir)
        if executor is None:  # (they start while the original is measured)
            executor = create_executor(self.config.executor, opening.spec, runner, self.output_dir)
        baseline, baseline_cache = measure_original(
            runner, opening, executor, self.isolation, self.book, self.listeners
        )
        if len(replay):
            log.info("resuming: %d finished trial(s) in the run store", len(replay))
        time_left = lambda: self._time_left(started)  # noqa: E731
        tell_baseline(opening, baseline, self.listeners, self.config.stop.max_trials, time_left, self.isolation)
        searched = search(
            self.config,
            self.objectives,
            opening,
            executor,
            store,
            replay,
            baseline,
            started,
            self.listeners,
            self.isolation,
            self.book,
        )
        if opening.prebuild is not None:  # what the guess's worker still evaluates ahead is not wanted now,
            opening.prebuild.cancel()  # and beside the confirmation's timing it is noise
        for record in runner.time_closest_misses(searched.loop.records, baseline.get("latency_ms")):
            searched.loop.judge(record, baseline)  # its objective, now measured
            store.record_trial(record.to_dict())
            self.book.mark(CLOSEST_MISS)
        ending, stop_reason = self._confirm(parts, baseline, searched)
        log.info("search and re-timing done: %.1f s", time.perf_counter() - started)
        result = gather(
            self.config,
            self.objectives,
            self.output_dir,
            self.isolation.stages,
            parts,
            searched.loop,
            baseline,
            baseline_cache,
            stop_reason,
            ending,
        )
        if finish_providers(result, parts, self.config, self.providers_skipped, searched.end):  # target, provider
            self.book.mark(SESSION_SETTINGS)  # the winner's session settings were searched: not "writing"
        return write(result, self.book, searched.end, self.listeners, started, runner)

    def _confirm(self, parts, baseline: dict[str, float], searched: Searched) -> tuple[Ending, str]:
        """The best candidates re-timed side by side with the original (ending.py), or why not; the stop reason with its note."""
        stop_reason = searched.stop_reason
        ending = Ending(unconfirmed=searched.not_retimed)
        if searched.top > 0:
            check_model_unchanged(parts.context)  # the original is timed from its file again
            ending = confirm_end(
                parts.context.evaluator,
                parts.context.model.path,
                baseline,
                searched.loop.records,
                searched.top,
                searched.end,
                stop_reason,
                prefer=searched.loop.strategy.answer(),
            )
            stop_reason = ending.stop_reason(stop_reason)
            self.book.mark(CONFIRMATION)
        return ending, stop_reason

    def _time_left(self, started: float) -> float | None:
        timeout = self.config.stop.timeout_s
        return None if not timeout else max(0.0, started + timeout - time.perf_counter())
