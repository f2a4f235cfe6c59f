"""The run loop: ask -> execute -> evaluate -> tell -> record -> stop? Up to ``executor.capacity`` trials in flight,
stored trials replayed (resume.py), known failures skipped, and no trial started that would end inside the end's
reserve."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, replace
from typing import Any, Protocol

from quantune.config.schema import StopConfig
from quantune.engine.executors.stage import stage_seconds
from quantune.engine.outcome.result import Result
from quantune.engine.plan.plan import Plan
from quantune.engine.run.deadline import TimeBudget
from quantune.engine.run.interrupts import DeferredInterrupt, raise_if_stopped
from quantune.engine.run.resume import Replay, SkipLog
from quantune.engine.run.timebook import stage_name
from quantune.engine.trials.failures import KnownFailures, classify
from quantune.engine.trials.selection import better, objective_value
from quantune.engine.trials.trial import Trial, TrialRecord
from quantune.evaluate import Criterion
from quantune.store import RunStore
from quantune.strategy import WAIT, Outcome, Proposal, Strategy

log = logging.getLogger("quantune")

# Proposals in a row that share a known failure before the run stops: the strategy learns nothing new from them.
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


@dataclass(frozen=True)
class Judge:
    """Judges a finished trial: the criterion on the metric, and the objective values the strategy is told."""

    criterion: Criterion
    metric: str
    objectives: list[str]

    def __call__(self, record: TrialRecord, baseline: dict[str, float]) -> None:
        if record.status != "ok":
            return
        check = self.criterion.check(baseline[self.metric], record.metrics[self.metric])
        record.meets_criterion = check.meets
        record.accuracy_loss = check.loss
        value = objective_value(record, self.objectives[0])  # inf when not measured (an untimed miss)
        record.objective = value if math.isfinite(value) else None  # results.json holds no Infinity

    def outcome(self, record: TrialRecord) -> Outcome:
        """What the strategy is told of a judged record."""
        if record.status != "ok":
            return Outcome(None)
        violation = 0.0 if record.accuracy_loss is None else self.criterion.violation(record.accuracy_loss)
        names = self.objectives
        values = tuple(objective_value(record, name) for name in names) if len(names) > 1 else None
        objective = math.inf if record.objective is None else record.objective  # ran, yet not measured
        return Outcome(
            objective, violation, record.meets_criterion, record.metrics, objectives=values, number=record.number
        )


class RunLoop:
    """One run's ask/tell loop, knowing the run only through its constructor, so it can be tested without the engine."""

    # a miss is left untimed where the strategy reads nothing of its speed (False: every trial timed)
    untimed_misses: bool = True

    def __init__(
        self,
        judge: Judge,
        plan: Plan,
        stop: StopConfig,
        listeners: Sequence[RunListener],
        strategy: Strategy,
        executor: Any,
        store: RunStore,
        replay: Replay,
        baseline: dict[str, float],
        budget: TimeBudget,
        *,
        check_inputs: Callable[[], None] | None = None,
        evaluated_ahead: Sequence[tuple[dict, tuple[str, ...]]] = (),
        wait_ahead: Callable[[dict, tuple[str, ...], float | None], bool] | None = None,
    ) -> None:
        """``check_inputs`` raises when an input changed under the run; ``evaluated_ahead``/``wait_ahead``: trials
        cached ahead."""
        self.judge = judge
        self.plan = plan
        self.stop = stop
        self.listeners = list(listeners)
        self.strategy = strategy
        self.executor = executor
        self.store = store
        self.replay = replay
        self.baseline = baseline
        self.budget = budget
        self.check_inputs = check_inputs
        self.evaluated_ahead = list(evaluated_ahead)
        self.wait_ahead = wait_ahead
        self.loop_started = time.perf_counter()  # after the baseline: what the loop's own work costs
        self.stages_at_start = stage_seconds()  # stages (ceilings, sensitivity) are one-offs, not per trial
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
        self.stage = ""  # the stage of the last trial started: a timeout names it
        self.abandoned = 0  # trials still running at the budget's abandon_at (see _wait)
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
            done = self._wait()
            if not done:
                self.abandoned = len(self.pending)
                self.pending.clear()
                return (stop_reason or f"timeout ({self.stop.timeout_s:g} s) reached{self._in_stage()}") + (
                    f"; {self.abandoned} trial(s) still running at the limit were abandoned (run again to resume them)"
                )
            for future in sorted(done, key=lambda f: self.pending[f][0].number):
                raise_if_stopped()  # a signal that a trial's code caught as an error still stops the run
                if self.check_inputs is not None:
                    self.check_inputs()
                _, proposal = self.pending.pop(future)
                self._finish(future.result(), proposal, replayed=False)

    def _wait(self) -> set[Future[TrialRecord]]:
        """The trials that finished (at least one), or none when ``abandon_at`` came first."""
        if self.budget.abandon_at is None:
            return wait(self.pending, return_when=FIRST_COMPLETED)[0]
        left = max(0.0, self.budget.abandon_at - time.perf_counter())
        return wait(self.pending, timeout=left, return_when=FIRST_COMPLETED)[0]

    def _launch(self, proposal: Proposal) -> bool:
        """Runs (or replays) the proposal; ``False`` when it would not finish before ``timeout_s``."""
        plan = self.plan
        flow = proposal.flow or plan.flow_of(proposal.point)
        # a miss's speed matters only to the closest miss: timed at the end if it may be it (engine.py)
        untimed_if_missed = self.untimed_misses and not proposal.speed_if_missed
        trial = Trial(self.asked, tuple(flow), proposal.point, untimed_if_missed)
        stored = self.replay.match(trial.number, list(flow), dict(proposal.point))
        if stored is None and not self._ahead(proposal.point, trial.flow) and self._would_overrun(trial.flow):
            return False
        self.stage = proposal.stage
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
        """Tells the strategy ``proposal`` failed, without running it, when it shares a known failure's signature."""
        flow = tuple(proposal.flow or self.plan.flow_of(proposal.point))
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
        """Whether a new trial of ``flow`` would end past the limit or inside the end's reserve (by trials so far)."""
        timeout = self.stop.timeout_s
        if not timeout:
            return False
        # a trial answered from the evaluation cache says nothing of how long the next one takes
        first_trial_s = self.budget.first_trial_s
        hits = [] if first_trial_s > 0 else self.records
        worked = [r for r in self.records if r.cache.get("evaluation") != "hit"] or hits
        same = [r.durations.get("total_s") for r in worked if tuple(r.flow) == flow]
        durations = [d for d in same if d] or [d for r in worked if (d := r.durations.get("total_s"))]
        if not durations:
            durations = [first_trial_s] if first_trial_s > 0 else []
        if not durations:
            return False
        ran = [d for r in self.records if r.number not in self.replayed_numbers and (d := r.durations.get("total_s"))]
        stages = stage_seconds() - self.stages_at_start
        outside = time.perf_counter() - self.loop_started - sum(ran) / self.executor.capacity - stages
        expected = sum(durations) / len(durations) + max(0.0, outside) / max(1, len(ran))
        elapsed = time.perf_counter() - self.budget.started
        reserve = self.budget.start_reserve_s
        reserve = self.budget.end_reserve_s if reserve is None else reserve
        if elapsed + expected <= timeout - reserve:
            return False
        kept = f", with {reserve:.0f} s kept for the re-timing and results" if reserve >= 0.5 else ""
        what = f"the next trial (about {expected:.{0 if expected >= 10 else 1}f} s) would end after it"
        what = what if expected >= 0.05 else "no time is left for another trial"
        self._overrun_reason = f"timeout ({timeout:g} s){self._in_stage()}: {what}{kept}"
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
            self.judge(record, self.baseline)
        record.told_index = self.told
        self.told += 1
        duplicate_of = self._duplicate_of(record)
        if duplicate_of is not None and not replayed:
            record.stage = f"{record.stage} (duplicate of trial {duplicate_of})".lstrip()
        outcome = self.judge.outcome(record)
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
        self.best = better(record, self.best, self.judge.objectives)
        self.failed += record.status == "failed"
        status = RunStatus(
            done=len(self.records) - self.duplicates,  # as max_trials counts them
            running=len(self.pending),
            failed=self.failed,
            max_trials=self.stop.max_trials,
            best=self.best,
            elapsed_s=time.perf_counter() - self.budget.started,
            replayed=self.replay.replayed,
        )
        for listener in self.listeners:
            listener.on_trial(record, status)

    def _duplicate_of(self, record: TrialRecord) -> int | None:
        """The earlier trial whose model is byte-identical: its evaluation is cached, and it is one candidate."""
        sha = record.model_sha256
        if record.status != "ok" or sha is None:
            return None
        first = self.model_owner.setdefault(sha, record.number)
        if first == record.number:
            return None
        self.duplicates += 1
        return first

    def _ahead(self, point: Any, flow: tuple[str, ...]) -> bool:
        """Whether the proposal was evaluated ahead: its trial reads the cache and is never refused for time."""
        if any(dict(point) == dict(p) and tuple(flow) == tuple(f) for p, f in self.evaluated_ahead):
            return True
        wait = self.wait_ahead  # one still being evaluated ahead: waited for, not run twice
        left = None if not self.stop.timeout_s else self.budget.started + self.stop.timeout_s - time.perf_counter()
        return bool(wait is not None and wait(dict(point), tuple(flow), None if left is None else max(0.0, left)))

    def _in_stage(self) -> str:
        """`` in the latency stage``: where the search was when the limit came (``""`` before any trial)."""
        return f" in the {stage_name(self.stage)} stage" if self.stage else ""

    def _should_stop(self) -> str:
        stop = self.stop
        met = sum(1 for r in self.records if r.meets_criterion)
        if stop.max_trials is not None and self.asked - self.duplicates >= stop.max_trials:
            return f"max_trials ({stop.max_trials}) reached"
        if stop.timeout_s == 0:
            if met:
                return "a trial met the criterion (timeout: 0)"
        elif (
            stop.timeout_s is not None
            and time.perf_counter() - self.budget.started >= stop.timeout_s - self.budget.end_reserve_s
        ):
            return f"timeout ({stop.timeout_s:g} s) reached{self._in_stage()}"
        if stop.stop_when_met and met:
            return "a trial met the criterion (stop_when_met)"
        if stop.n_candidates is not None and met >= stop.n_candidates:
            return f"{stop.n_candidates} candidate(s) found (n_candidates)"
        return ""
