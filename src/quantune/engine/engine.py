"""The run loop: ask -> execute -> evaluate -> tell -> record -> stop?

The engine knows neither ONNX nor Optuna: the strategy proposes, the executor runs, the
criterion judges, the store records. It keeps up to ``executor.capacity`` trials in flight,
replays a stored run's finished trials instead of running them again (see resume.py), and
on Ctrl-C stops asking, abandons running trials and writes what finished.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from quantune.config import Config, LoadedConfig
from quantune.engine.baseline import original_figures
from quantune.engine.confirm import confirm_latency
from quantune.engine.executors import WorkerSpec, create_executor
from quantune.engine.executors.factory import eval_threads_for
from quantune.engine.executors.stage import Isolation, StageLog
from quantune.engine.failures import KnownFailures, classify
from quantune.engine.identity import fingerprints
from quantune.engine.interrupts import DeferredInterrupt, stop_cause
from quantune.engine.output import close_output, open_output
from quantune.engine.resume import Replay, SkipLog
from quantune.engine.runner import TrialRunner
from quantune.engine.selection import better, closest_miss, objective_value, pareto_front
from quantune.engine.setup import RunParts, build_run, for_workers, preflight
from quantune.engine.stages import isolated
from quantune.engine.trial import Trial, TrialRecord
from quantune.engine.verdict import decide
from quantune.errors import ConfigError
from quantune.evaluate import Criterion
from quantune.evaluate.criterion import check_budget
from quantune.report.result import Result, write_outputs
from quantune.search import create_sampler
from quantune.search.directions import sampler_directions
from quantune.space import SearchSpace
from quantune.space.report import EXACT_LIMIT
from quantune.store import RunStore, cache_key
from quantune.store.faults import storage_errors
from quantune.strategy import WAIT, Outcome, Proposal, SearchProblem, Strategy, create_strategy
from quantune.strategy.accuracy import accuracy_fields  # model graph, sensitivity, strategy options
from quantune.strategy.options import checked_options

log = logging.getLogger("quantune")

# Proposals in a row that share a known failure before the run stops: the strategy keeps
# proposing only what is known to fail (told as failed each time, it learns nothing new).
MAX_CONSECUTIVE_SKIPS = 500


@dataclass
class RunStatus:
    """What a progress display needs after each trial."""

    done: int
    running: int
    failed: int
    max_trials: int | None
    best: TrialRecord | None
    elapsed_s: float
    replayed: int


class RunListener(Protocol):
    def on_start(self, max_trials: int | None, baseline: dict[str, float]) -> None: ...
    def on_trial(self, record: TrialRecord, status: RunStatus) -> None: ...
    def on_end(self, result: Result) -> None: ...


class Engine:
    """Runs one config to its result. ``Engine(loaded_config, output_dir).run()``."""

    def __init__(
        self,
        loaded: LoadedConfig,
        output_dir: Path,
        *,
        restart: bool = False,
        listeners: Sequence[RunListener] = (),
    ) -> None:
        self.loaded = loaded
        self.config = loaded.config
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
        parts = build_run(self.loaded, eval_threads=eval_threads_for(workers))
        # Where and how trials run does not change their results, so it is not part of the run's identity.
        identity = self.config.model_dump(mode="json", exclude={"executor"})
        # ... but the content of the model, the data and the scripts the config names is (identity.py).
        sources = parts.context.sources
        config_hash = cache_key("config", identity, fingerprints(sources))
        if parts.context.start.sha256 != parts.context.model.sha256:  # trials of another preparation never mix in
            config_hash = cache_key(config_hash, "prepared", parts.context.start.sha256)
        spec = WorkerSpec(for_workers(self.loaded, parts), config_hash, eval_threads_for(workers), sources)
        strategy = self._strategy(parts, spec)  # config mistakes surface before the output folder is claimed
        # so do data the model cannot take and a metric that is not a finite number (the original
        # evaluated in a stage worker, see baseline.py)
        preflight(parts, baseline=lambda: original_figures(TrialRunner(parts.context), spec, self.isolation)[0])
        store = open_output(
            self.output_dir, config_hash, restart=self.restart, protected=[parts.context.model.path], sources=sources
        )
        failed = True  # until the run returns: a run that fails with no finished trial leaves nothing behind
        try:
            with storage_errors(self.output_dir, "--output", refused=False):
                (self.output_dir / "config.json").write_text(json.dumps(self.config.model_dump(mode="json"), indent=2))
                handler = _attach_log(self.output_dir / "quantune.log")
                try:
                    result = self._run(parts, strategy, store, spec)
                finally:
                    _detach_log(handler)
            failed = False
            return result
        finally:
            close_output(store, failed=failed)

    def _strategy(self, parts: RunParts, spec: WorkerSpec | None = None) -> Strategy:
        _check_runnable(parts.plan.space)
        strategy = create_strategy(self.config.search.strategy)
        strategy.bind(search_problem(parts, self.config, self.isolation, spec))
        return strategy

    def _run(self, parts: RunParts, strategy: Strategy, store: RunStore, spec: WorkerSpec) -> Result:
        started = time.perf_counter()
        runner = TrialRunner(parts.context)
        replay = Replay(store.trials())
        executor = create_executor(self.config.executor, spec, runner, self.output_dir)  # workers start meanwhile
        try:
            baseline, baseline_cache = original_figures(runner, spec, self.isolation, log_dir=self.isolation.log_dir)
            check_budget(parts.criterion, self.config.evaluation.metric, baseline)
        except BaseException:  # the original does not evaluate (or Ctrl-C): no run, no workers left behind
            executor.shutdown(kill=True)
            raise
        log.info("baseline (%s): %s", baseline_cache, baseline)
        _announce_preparation(parts, self.listeners)
        if len(replay):
            log.info("resuming: %d finished trial(s) in the run store", len(replay))
        strategy.observe_baseline(baseline)
        for listener in self.listeners:
            listener.on_start(self.config.stop.max_trials, baseline)
        loop = _Loop(self, parts, strategy, executor, store, replay, baseline, started)
        try:
            stop_reason = loop.run()
            executor.shutdown()
        except KeyboardInterrupt as exc:
            stop_reason = f"interrupted ({stop_cause(exc)}): finished trials are saved; run again to resume"
            executor.shutdown(kill=True)
        except BaseException:  # e.g. workers that cannot start: stop them, then say why
            executor.shutdown(kill=True)
            raise
        confirmation = None
        top = self.config.evaluation.latency.confirm_top
        # On Ray the trials were timed on the cluster's workers, which may be other hardware than
        # the machine running the engine: their figures stand as measured.
        local = self.config.executor.kind != "ray"
        if self.objectives == ["latency"] and top > 0 and local and not stop_reason.startswith("interrupted"):
            original = parts.context.model.path
            try:
                # at most a tenth of the search's time (at least 3 s): a few rounds suffice interleaved
                budget_s = max(3.0, 0.1 * (time.perf_counter() - started))
                confirmation = confirm_latency(
                    parts.context.evaluator, original, baseline, loop.records, top, budget_s=budget_s
                )
            except KeyboardInterrupt:  # the search is done and kept; only the re-timing is skipped
                stop_reason += "; latency re-timing skipped (Ctrl-C)"
        result = self._result(parts, loop, baseline, baseline_cache, stop_reason, started, confirmation)
        result.skipped_known_failures = loop.skips.count
        result.strategy_notes = strategy.learned()
        result.target = parts.context.evaluator.backend.describe()
        write_outputs(result)
        for listener in self.listeners:
            listener.on_end(result)
        return result

    def _result(
        self, parts, loop: _Loop, baseline, baseline_cache: str, stop_reason: str, started: float, confirmation=None
    ) -> Result:
        records = sorted(loop.records, key=lambda r: r.number)
        # after a confirmation, only figures timed side by side compete, and their paired ratios decide
        verdict = decide(records, self.objectives, baseline, confirmation, parts.criterion.kind)
        return Result(
            baseline=baseline,
            trials=records,
            best=verdict.best,
            closest_miss=closest_miss(records, self.objectives),
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

    def judge(self, record: TrialRecord, baseline: dict[str, float], criterion) -> None:
        if record.status != "ok":
            return
        metric = self.config.evaluation.metric
        check = criterion.check(baseline[metric], record.metrics[metric])
        record.meets_criterion = check.meets
        record.accuracy_loss = check.loss
        record.objective = objective_value(record, self.objectives[0])


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


def search_problem(
    parts: RunParts, config: Config, isolation: Isolation | None = None, spec: Any = None
) -> SearchProblem:
    """What the config's strategy may know of this run: spaces, flows, a sampler factory, limits,
    and (for accuracy-driven strategies) the model graph and a sensitivity function (run as
    ``isolation`` says: in a worker process, or in this one without it; ``spec``, a WorkerSpec,
    lets the speed ceilings and the profile run in workers too, see stages.py)."""
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
        **isolated(
            accuracy_fields(
                parts.context, parts.plan, checked_options(search.strategy, search.strategy_options), isolation
            ),
            isolation,
            spec,
        ),
    )


class _Loop:
    """One run's ask/tell loop and its bookkeeping."""

    def __init__(self, engine: Engine, parts: RunParts, strategy: Strategy, executor, store, replay, baseline, started):
        self.engine = engine
        self.parts = parts
        self.strategy = strategy
        self.executor = executor
        self.store = store
        self.replay = replay
        self.baseline = baseline
        self.started = started
        self.loop_started = time.perf_counter()  # after the baseline: what the loop's own work costs
        self.records: list[TrialRecord] = []
        self.pending: dict[Future[TrialRecord], tuple[Trial, Proposal]] = {}
        self.replayed_proposals: dict[int, Proposal] = {}
        self.asked_after: dict[int, int] = {}
        self.replayed_numbers: set[int] = set()
        self.best: TrialRecord | None = None
        self.failed = 0
        self.step_configs: dict[int, dict[str, Any]] = {}
        self.asked = 0
        self.told = 0
        self.interrupts = DeferredInterrupt()
        self._overrun_reason = ""
        self.model_owner: dict[str, int] = {}  # candidate model hash -> first trial that produced it
        self.duplicates = 0  # trials whose model an earlier trial produced: not counted in max_trials
        self.known = KnownFailures()
        self.skips = SkipLog(store, resuming=replay.active)
        self._consecutive_skips = 0

    def run(self) -> str:
        with self.interrupts:
            return self._run()

    def _run(self) -> str:
        stop_reason = ""
        while True:
            while not stop_reason and len(self.pending) < self.executor.capacity:
                # Replaying: deliver the tells that came before this ask in the original run.
                while self.replay.waiting and self.told < self.skips.tells_before(
                    self.asked, self.replay.asked_after(self.asked)
                ):
                    self._tell_replayed()
                stop_reason = self._should_stop()
                if stop_reason:
                    break
                proposal = self.strategy.ask()
                if proposal is WAIT:
                    if self.replay.waiting:
                        self._tell_replayed()
                        continue
                    break
                if proposal is None:
                    done = self.strategy.finished_reason or "space exhausted or strategy done"
                    stop_reason = f"search finished ({done})"
                    break
                if self._skip_known_failure(proposal):
                    if self._consecutive_skips >= MAX_CONSECUTIVE_SKIPS:
                        stop_reason = (
                            f"every remaining point shares a known failure ({self._consecutive_skips} "
                            "proposals in a row were not run)"
                        )
                        break
                    continue
                if not self._launch(proposal):
                    stop_reason = self._overrun_reason
                    break
            if self.replay.waiting and not self.pending:
                self._tell_replayed()
                continue
            if not self.pending:
                return stop_reason
            done, _ = wait(self.pending, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: self.pending[f][0].number):
                _, proposal = self.pending.pop(future)
                self._finish(future.result(), proposal, replayed=False)

    def _launch(self, proposal: Proposal) -> bool:
        """Runs (or replays) the proposal; ``False`` when it would not finish before ``timeout_s``."""
        plan = self.parts.plan
        flow = proposal.flow or plan.flow_of(proposal.point)
        trial = Trial(self.asked, tuple(flow), proposal.point)
        stored = self.replay.match(trial.number, list(flow), dict(proposal.point))
        if stored is None and self._would_overrun(trial.flow):
            return False
        self.step_configs[trial.number] = {
            step.id: config.model_dump(mode="json") for step, config in plan.configs_for(proposal.point, flow)
        }
        self.asked += 1
        self._consecutive_skips = 0
        if stored is not None:
            self.replayed_proposals[trial.number] = proposal
            self.replayed_numbers.add(trial.number)
            return True
        self.asked_after[trial.number] = self.told
        self.pending[self.executor.submit(trial)] = (trial, proposal)
        return True

    def _skip_known_failure(self, proposal: Proposal) -> bool:
        """Tells the strategy that ``proposal`` failed, without running it, when it shares the
        signature of a known failure class (see failures.py); ``False`` when it must run."""
        flow = tuple(proposal.flow or self.parts.plan.flow_of(proposal.point))
        failure_class = self.known.match(flow, proposal.point)
        if failure_class is None:
            return False
        with self.interrupts.critical():
            self.strategy.tell(proposal, Outcome(None))
            self.skips.record(self.asked, self.told)
            self._consecutive_skips += 1
        log.info("not run, shares the known failure %r: %s %s", failure_class, list(flow), dict(proposal.point))
        return True

    def _would_overrun(self, flow: tuple[str, ...]) -> bool:
        """Whether a new trial of ``flow`` is expected to end after ``stop.timeout_s``.

        The expectation is the mean duration of the finished trials of the same flow (of all
        trials when the flow has none yet), plus the run's own work per trial outside the
        trials (a strategy timing speed ceilings, sensitivity, sampling): the wall time since
        the loop started that the trials' durations do not explain. With no finished trial
        there is none. A run stops rather than start work it would have to abandon or overrun
        its limit for.
        """
        timeout = self.engine.config.stop.timeout_s
        if not timeout:
            return False
        same = [r.durations.get("total_s") for r in self.records if tuple(r.flow) == flow]
        durations = [d for d in same if d] or [d for r in self.records if (d := r.durations.get("total_s"))]
        if not durations:
            return False
        ran = [d for r in self.records if r.number not in self.replayed_numbers and (d := r.durations.get("total_s"))]
        outside = time.perf_counter() - self.loop_started - sum(ran) / self.executor.capacity
        expected = sum(durations) / len(durations) + max(0.0, outside) / max(1, len(ran))
        elapsed = time.perf_counter() - self.started
        if elapsed + expected <= timeout:
            return False
        self._overrun_reason = f"timeout ({timeout:g} s): the next trial (about {expected:.0f} s) would end after it"
        return True

    def _tell_replayed(self) -> None:
        record = self.replay.next_tell()
        if record is not None:
            self._finish(record, self.replayed_proposals.pop(record.number), replayed=True)

    def _finish(self, record: TrialRecord, proposal: Proposal, *, replayed: bool) -> None:
        with self.interrupts.critical():  # stored, counted and told together, or not at all
            self._record(record, proposal, replayed=replayed)

    def _record(self, record: TrialRecord, proposal: Proposal, *, replayed: bool) -> None:
        if record.status == "failed" and record.failure_class is None:
            record.failure_class = classify(record.error)
        failure = record.failure_class if record.status == "failed" else None
        self.known.learn(record.flow, record.params, failure)
        if not replayed:
            record.stage = proposal.stage
            record.asked_after = self.asked_after.pop(record.number)
            self.engine.judge(record, self.baseline, self.parts.criterion)
        record.told_index = self.told
        self.told += 1
        duplicate_of = self._duplicate_of(record)
        if duplicate_of is not None and not replayed:
            record.stage = f"{record.stage} (duplicate of trial {duplicate_of})".lstrip()
        outcome = _outcome(record, self.parts.criterion, self.engine.objectives)
        if duplicate_of is not None:
            outcome = replace(outcome, duplicate_of=duplicate_of)
        note = self.strategy.tell(proposal, outcome)
        if note and not replayed:
            record.stage = f"{record.stage} -> {note}"
        if not replayed:
            row = record.to_dict()
            self.store.record_trial(row)
            log.info("trial %d: %s", record.number, row)
        self.records.append(record)
        self.best = better(record, self.best, self.engine.objectives)
        self.failed += record.status == "failed"
        status = RunStatus(
            done=len(self.records),
            running=len(self.pending),
            failed=self.failed,
            max_trials=self.engine.config.stop.max_trials,
            best=self.best,
            elapsed_s=time.perf_counter() - self.started,
            replayed=self.replay.replayed,
        )
        for listener in self.engine.listeners:
            listener.on_trial(record, status)

    def _duplicate_of(self, record: TrialRecord) -> int | None:
        """The earlier trial whose model is byte-identical to this one's (its evaluation is cached, and
        this trial does not count against ``stop.max_trials``: two settings that give one model are one
        candidate, e.g. Entropy and MinMax calibration on some models)."""
        sha = record.model_sha256
        if record.status != "ok" or sha is None:
            return None
        first = self.model_owner.setdefault(sha, record.number)
        if first == record.number:
            return None
        self.duplicates += 1
        return first

    def _should_stop(self) -> str:
        stop = self.engine.config.stop
        met = sum(1 for r in self.records if r.meets_criterion)
        if stop.max_trials is not None and self.asked - self.duplicates >= stop.max_trials:
            return f"max_trials ({stop.max_trials}) reached"
        if stop.timeout_s == 0:
            if met:
                return "a trial met the criterion (timeout: 0)"
        elif stop.timeout_s is not None and time.perf_counter() - self.started >= stop.timeout_s:
            return f"timeout ({stop.timeout_s:g} s) reached"
        if stop.stop_when_met and met:
            return "a trial met the criterion (stop_when_met)"
        if stop.n_candidates is not None and met >= stop.n_candidates:
            return f"{stop.n_candidates} candidate(s) found (n_candidates)"
        return ""


def _outcome(record: TrialRecord, criterion: Criterion, objectives: Sequence[str] = ()) -> Outcome:
    if record.status != "ok":
        return Outcome(None)
    violation = 0.0 if record.accuracy_loss is None else criterion.violation(record.accuracy_loss)
    values = tuple(objective_value(record, name) for name in objectives) if len(objectives) > 1 else None
    return Outcome(record.objective, violation, record.meets_criterion, record.metrics, objectives=values)


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


def _attach_log(path: Path) -> tuple[logging.Handler, int]:
    """Sends this run's log (and onnxruntime's quantization warnings) to ``quantune.log``."""
    handler = logging.FileHandler(path, mode="a")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    previous = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler, previous


def _detach_log(attached: tuple[logging.Handler, int]) -> None:
    handler, previous = attached
    root = logging.getLogger()
    root.removeHandler(handler)
    root.setLevel(previous)
    handler.close()
