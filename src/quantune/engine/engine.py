"""One run from config to result: set-up, the original's figures, the loop, the verdict, the files.

The engine knows neither ONNX nor Optuna: setup builds the run's parts (and the strategy's
problem, see problem.py), the strategy proposes, the executor runs, the loop (loop.py) asks
and tells, the criterion judges, the store records. On Ctrl-C the loop stops asking, running
trials are abandoned and what finished is written.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from quantune.config import LoadedConfig
from quantune.engine.baseline import (
    cached_figures,
    evaluation_seconds,
    original_figures,
    retime_original,
    timed_quickly,
)
from quantune.engine.confirm import MIN_ROUNDS, timing_rounds
from quantune.engine.deadline import WRITE_S, EndBudget, end_cost_s, least_end_cost_s, session_load_s, write_s
from quantune.engine.ending import Ending, confirm_end, retimes
from quantune.engine.executors import Executor, WorkerSpec, create_executor
from quantune.engine.executors.contexts import check_main_importable, warm_up
from quantune.engine.executors.factory import eval_threads_for
from quantune.engine.executors.stage import Isolation, StageLog
from quantune.engine.identity import fingerprints
from quantune.engine.interrupts import stop_cause
from quantune.engine.loop import Judge, RunListener, RunLoop
from quantune.engine.output import attach_log, close_output, detach_log, open_output
from quantune.engine.prebuild import Prebuild
from quantune.engine.problem import search_problem
from quantune.engine.provider_run import expand_providers, finish_providers, with_openings
from quantune.engine.result import Result, write_outputs
from quantune.engine.resume import Replay
from quantune.engine.runner import TrialRunner
from quantune.engine.selection import closest_miss, miss_front, pareto_front
from quantune.engine.setup import RunParts, build_run, for_workers, preflight
from quantune.engine.timebook import CONFIRMATION, ORIGINAL, SET_UP, START_UP, WRITING, TimeBook
from quantune.engine.trial import TrialRecord
from quantune.engine.verdict import decide
from quantune.errors import ConfigError
from quantune.evaluate._exchange import scratch_root
from quantune.evaluate.criterion import check_budget
from quantune.space import SearchSpace
from quantune.space.report import EXACT_LIMIT
from quantune.store import RunStore, cache_key
from quantune.store.faults import storage_errors
from quantune.strategy import Strategy, create_strategy

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
        """``started``: the ``time.perf_counter()`` reading ``stop.timeout_s`` counts from (the
        CLI: the process's start, see deadline.py); by default when ``run()`` is called."""
        self.loaded, self.providers_skipped = expand_providers(loaded)  # target.providers: the provider axis
        self.started = started
        self._prebuild: Prebuild | None = None
        self._early: tuple[Executor, Path] | None = None  # workers started before the output was claimed
        self._scratch: Path | None = None  # their first logs' folder
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
        workers = self.config.executor.workers
        begun = time.perf_counter()
        started = self.started if self.started is not None else begun  # the limit covers set-up too
        self.book = book = TimeBook(started)
        book.mark(START_UP)
        if not self.isolation.inline:  # the workers' fork server imports beside the set-up (contexts.py)
            check_main_importable()
            warm_up()
        parts = build_run(self.loaded, eval_threads=eval_threads_for(workers))
        log.info("set-up (model, data, preparation): %.1f s", time.perf_counter() - begun)
        # Where and how trials run does not change their results, so it is not part of the run's
        # identity; nor do the stop conditions: a run stopped at 8 trials goes on to 16 in the same
        # folder (its 8 are replayed, as Optuna continues a study with more n_trials).
        identity = self.config.model_dump(mode="json", exclude={"executor", "stop"})
        # ... but the content of the model, the data and the scripts the config names is (identity.py).
        sources = parts.context.sources
        config_hash = cache_key("config", identity, fingerprints(sources))
        if parts.context.start.sha256 != parts.context.model.sha256:  # trials of another preparation never mix in
            config_hash = cache_key(config_hash, "prepared", parts.context.start.sha256)
        run_id = uuid.uuid4().hex
        spec = WorkerSpec(for_workers(self.loaded, parts), config_hash, eval_threads_for(workers), sources, run_id)
        strategy = self._strategy(parts, spec)  # config mistakes surface before the output folder is claimed
        # so do data the model cannot take and a metric that is not a finite number (the original
        # evaluated in a stage worker, see baseline.py)
        # the strategy's speed-ceiling models are built meanwhile, on the other core (prebuild.py)
        make = lambda: create_strategy(self.config.search.strategy)  # noqa: E731
        if cached_figures(TrialRunner(parts.context)) is None:  # else the original takes no time to overlap
            self._prebuild = Prebuild.start(strategy, make, spec, self.isolation)
        self._early = self._start_workers(parts, spec)
        try:
            # beside the builds ahead: half the cores, a quick timing (timed again before the ceilings)
            beside = self._prebuild is not None

            def baseline() -> dict[str, float]:
                book.mark(SET_UP)
                figures = original_figures(TrialRunner(parts.context), spec, self.isolation, beside=beside)[0]
                book.mark(ORIGINAL)
                return figures

            preflight(parts, baseline=baseline)
            store = open_output(
                self.output_dir,
                config_hash,
                restart=self.restart,
                protected=[parts.context.model.path],
                sources=sources,
            )
            book.mark(SET_UP)
        except BaseException:
            if self._prebuild is not None:
                self._prebuild.cancel()
            self._stop_early_workers()
            raise
        failed = True  # until the run returns: a run that fails with no finished trial leaves nothing behind
        try:
            with storage_errors(self.output_dir, "--output", refused=False):
                (self.output_dir / "config.json").write_text(json.dumps(self.config.model_dump(mode="json"), indent=2))
                handler = attach_log(self.output_dir / "quantune.log")
                try:
                    result = self._run(parts, strategy, store, spec, started)
                finally:
                    detach_log(handler)
            failed = False
            return result
        finally:
            if self._prebuild is not None:  # a run that ended before its ceilings: the builds stop
                self._prebuild.cancel()
            self._stop_early_workers()
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)
            close_output(store, failed=failed)

    def _start_workers(self, parts: RunParts, spec: WorkerSpec) -> tuple[Executor, Path] | None:
        """A process executor's workers, started now: they build the run while the original is
        evaluated, not after it (0.3-0.6 s before the first trial), logging to a scratch folder
        until the output folder is claimed (``ProcessExecutor.move_logs``)."""
        if self.config.executor.kind != "process":
            return None
        scratch = Path(tempfile.mkdtemp(prefix="quantune-workers-", dir=scratch_root()))
        return create_executor(self.config.executor, spec, TrialRunner(parts.context), scratch), scratch

    def _stop_early_workers(self) -> None:
        """The early workers stopped, when the run did not take them (it failed first), and their scratch folder gone."""
        if self._early is None:
            return
        executor, scratch = self._early
        self._early = None
        executor.shutdown(kill=True)
        shutil.rmtree(scratch, ignore_errors=True)

    def _time_left(self, started: float) -> float | None:
        timeout = self.config.stop.timeout_s
        return None if not timeout else max(0.0, started + timeout - time.perf_counter())

    def _ceilings_ready(self, parts: RunParts, baseline: dict[str, float], strategy: Strategy) -> Callable[[], None]:
        """What the speed ceilings' timing waits for (it times the models built ahead): the builds,
        then the original's latency timed again here -- it was timed beside the builds -- into
        the figures the run and its strategy hold (once)."""
        prebuild = self._prebuild

        def ready() -> None:
            if prebuild is None or parts.context.before_ceilings is None:
                return
            parts.context.before_ceilings = None
            prebuild.join(self.isolation.deadline.at)
            prebuild.keep_log(self.isolation.log_dir)
            if parts.context.baseline_status == "miss" or timed_quickly(parts.context):
                fresh = retime_original(parts.context, self.isolation.deadline.at)
                baseline.update(fresh)
                strategy.baseline.update(fresh)

        return ready

    def _not_retimed(self) -> str:
        """``""`` when the run ends by re-timing its best models side by side, else why not (ending.py)."""
        return retimes(self.objectives, self.config.evaluation.latency.confirm_top, self.config.executor.kind)

    def _strategy(self, parts: RunParts, spec: WorkerSpec | None = None) -> Strategy:
        _check_runnable(parts.plan.space)
        strategy = with_openings(
            create_strategy(self.config.search.strategy), parts.plan, self.isolation.deadline
        )  # providers first
        strategy.bind(search_problem(parts, self.config, self.isolation, spec))
        return strategy

    def _run(self, parts: RunParts, strategy: Strategy, store: RunStore, spec: WorkerSpec, started: float) -> Result:
        runner = TrialRunner(parts.context)
        replay = Replay(store.trials())
        if self._early is not None:  # started with the original's evaluation: their logs come here now
            executor, scratch = self._early
            self._early = None
            executor.move_logs(self.output_dir / "workers")  # type: ignore[attr-defined]
            self._scratch = scratch  # removed when the run ends (a worker still starting writes there until told)
        else:
            executor = create_executor(self.config.executor, spec, runner, self.output_dir)  # workers start meanwhile
        try:
            baseline, baseline_cache = original_figures(runner, spec, self.isolation, log_dir=self.isolation.log_dir)
            check_budget(parts.criterion, self.config.evaluation.metric, baseline)
        except BaseException:  # the original does not evaluate (or Ctrl-C): no run, no workers left behind
            executor.shutdown(kill=True)
            raise
        if self._prebuild is None and timed_quickly(parts.context):  # an earlier run's quick timing
            baseline.update(retime_original(parts.context))
        book = self.book
        book.mark(ORIGINAL)
        log.info("baseline (%s): %s", baseline_cache, baseline)
        _announce_preparation(parts, self.listeners)
        if len(replay):
            log.info("resuming: %d finished trial(s) in the run store", len(replay))
        strategy.observe_baseline(baseline)
        if self._prebuild is not None:  # built while the original was evaluated (prebuild.py)
            self._prebuild.wait_first_guess(self._time_left(started))
            parts.context.before_ceilings = self._ceilings_ready(parts, baseline, strategy)
        for listener in self.listeners:
            listener.on_start(self.config.stop.max_trials, baseline)
        judge = Judge(parts.criterion, self.config.evaluation.metric, self.objectives)
        size = baseline.get("size_bytes", 0.0)
        report_s = end_cost_s(self.listeners) - WRITE_S
        least = least_end_cost_s(self.listeners)
        end = EndBudget(self.config.stop.timeout_s, started, write_s(size), report_s, session_load_s(size), least)
        not_retimed = self._not_retimed()
        top = 0 if not_retimed else self.config.evaluation.latency.confirm_top
        warmup, _ = timing_rounds(self.config.evaluation.latency.warmup, 1, 1.0, 0.0)
        loop = RunLoop(
            judge, parts.plan, self.config.stop, self.listeners, strategy, executor, store, replay, baseline, started
        )
        end.arm(loop, baseline.get("latency_ms", 0.0), top, warmup, MIN_ROUNDS)  # its reserves and abandon time
        loop.evaluated_ahead = self._prebuild.ahead() if self._prebuild is not None else []  # read from the cache
        # before any trial says (loop.py): a calibration and an evaluation as long as the original's, and a timing
        rounds = self.config.evaluation.latency.warmup + self.config.evaluation.latency.repeats
        loop.first_trial_s = 2 * evaluation_seconds(parts.context) + rounds * baseline.get("latency_ms", 0.0) / 1000
        book.search_starts()
        if end.limited:  # a strategy's stage (sensitivity, ceilings) stops there too
            self.isolation.deadline.at = started + float(self.config.stop.timeout_s or 0) - loop.end_reserve_s
        try:
            stop_reason = loop.run()
            log.info("search stopped (%s): %.1f s", stop_reason, time.perf_counter() - started)
            executor.shutdown(kill=bool(loop.abandoned))
        except KeyboardInterrupt as exc:
            stop_reason = f"interrupted ({stop_cause(exc)}): finished trials are saved; run again to resume"
            executor.shutdown(kill=True)
        except BaseException:  # e.g. workers that cannot start: stop them, then say why
            executor.shutdown(kill=True)
            raise
        book.search_ends(loop.records, loop.replayed_numbers)
        ending = Ending(unconfirmed=not_retimed)
        if top > 0:
            ending = confirm_end(
                parts.context.evaluator, parts.context.model.path, baseline, loop.records, top, end, stop_reason
            )
            stop_reason += ending.stop_note
            book.mark(CONFIRMATION)
        log.info("search and re-timing done: %.1f s", time.perf_counter() - started)
        result = self._result(parts, loop, baseline, baseline_cache, stop_reason, started, ending)
        result.skipped_known_failures = loop.skips.count
        result.strategy_notes = strategy.learned()
        finish_providers(result, parts, self.config, self.providers_skipped, end)  # target, provider, its session
        result.latency_confirmation_skipped = ending.skipped or None

        def written() -> None:  # the models are saved; results.json is next and takes no time
            book.mark(WRITING)
            result.time_spent_s = book.figures()
            result.duration_s = time.perf_counter() - started

        write_outputs(result, before_json=written)
        result.time_left_s = end.left_s() if end.limited else None  # report.html is drawn only if it fits
        for listener in self.listeners:
            listener.on_end(result)
        log.info("results written: %.1f s", time.perf_counter() - started)
        return result

    def _result(
        self, parts, loop: RunLoop, baseline, baseline_cache: str, stop_reason: str, started: float, ending: Ending
    ) -> Result:
        records = sorted(loop.records, key=lambda r: r.number)
        # after a confirmation, only figures timed side by side compete, and their paired ratios decide
        confirmation = ending.confirmation
        kind, wins = parts.criterion.kind, loop.strategy.original_wins
        verdict = decide(records, self.objectives, baseline, confirmation, kind, wins, ending.unconfirmed)
        return Result(
            baseline=baseline,
            trials=records,
            best=verdict.best,
            closest_miss=closest_miss(records, self.objectives, baseline.get("latency_ms")),
            miss_front=[r.number for r in miss_front(records, baseline.get("latency_ms"))],
            pareto_front=[r.number for r in pareto_front(records, self.objectives)] if len(self.objectives) > 1 else [],
            metric=self.config.evaluation.metric,
            criterion={
                "type": parts.criterion.kind,
                "tolerable_loss": parts.criterion.tolerable_loss,
                "higher_is_better": parts.criterion.higher_is_better,
                "description": parts.criterion.describe(),
            },
            objective=self.objectives[0],
            objectives=self.objectives,
            stop_reason=stop_reason,
            duration_s=time.perf_counter() - started,
            output_dir=self.output_dir,
            cache_stats=_cache_stats([r for r in records if r.number not in loop.replayed_numbers], baseline_cache),
            step_configs=loop.step_configs,
            replayed=loop.replay.replayed,
            latency_confirmation=confirmation.to_dict() if confirmation else None,
            verdict=verdict.kind,
            verdict_reason=verdict.reason,
            preparation=parts.context.preparation.to_dict() if parts.context.preparation else None,
            stage_peak_rss_mb=_stage_peaks(self.isolation.stages, records),
            stage_errors=list(self.isolation.stages.errors),
        )


def _announce_preparation(parts: RunParts, listeners: Sequence[RunListener]) -> None:
    """The run log gets every change and dropped step of model preparation; a listener with an
    ``on_prepared`` method (the console) gets the preparation itself."""
    preparation = parts.context.preparation
    if preparation is None:
        return
    for line in preparation.steps:
        log.info("prepared (%s): %s", preparation.cache, line)
    for line in preparation.warnings:
        log.warning("%s", line)
    if preparation.steps:
        log.info("trials start from the prepared model %s; the baseline is the original", preparation.model)
    for listener in listeners:
        hook = getattr(listener, "on_prepared", None)
        if hook is not None:
            hook(preparation)


def _check_runnable(space: SearchSpace) -> None:
    """A space whose every point is pruned is a config mistake, not a run of zero trials."""
    if not space.is_finite() or space.raw_size() > EXACT_LIMIT:  # walked to prove a runnable point
        return
    if next(iter(space.iterate()), None) is None:
        raise ConfigError(
            "passes: every point of the search space is pruned, so nothing can run: check the fixed "
            "parameters against the pass validators, target.provider, which passes may follow which "
            "(e.g. static_quant never follows graph_opt at level 'extended' or 'all'), what the model allows "
            "(per-channel QDQ needs opset 13, dynamic_quant needs Conv weights as initializers: prepare: auto "
            "fixes both where it can), and your rules (`quantune space CONFIG` shows the size per flow)"
        )


def _stage_peaks(stages: StageLog, records: list[TrialRecord]) -> dict[str, float]:
    """Peak resident memory per stage: the run's own stages, and the largest calibration any trial ran."""
    peaks = dict(stages.peaks)
    for record in records:
        for key, value in record.durations.items():
            if key.endswith("_peak_rss_mb") and isinstance(value, int | float):
                stage = key.removesuffix("_peak_rss_mb")
                peaks[stage] = max(peaks.get(stage, 0.0), float(value))
    return dict(sorted(peaks.items()))


def _cache_stats(records: list[TrialRecord], baseline_cache: str) -> dict[str, dict[str, int]]:
    """Cache hits and misses of the work this run did (replayed trials did none)."""
    stats: dict[str, dict[str, int]] = {"baseline": {"hits": 0, "misses": 0}}
    stats["baseline"]["hits" if baseline_cache == "hit" else "misses"] += 1
    for record in records:
        for step, outcome in record.cache.items():
            entry = stats.setdefault(step, {"hits": 0, "misses": 0})
            entry["hits" if outcome == "hit" else "misses"] += 1
    return stats
