"""The run loop: ask -> execute -> evaluate -> tell -> record -> stop?

The engine knows neither ONNX nor Optuna: the sampler proposes points, the executor runs
them, the criterion judges them, the store records them. Listeners (progress bars, logs)
are told about each finished trial.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from pathlib import Path
from typing import Any, Protocol

from quantune.config import LoadedConfig
from quantune.engine.executor import Executor, InProcessExecutor
from quantune.engine.output import open_output
from quantune.engine.runner import TrialRunner
from quantune.engine.selection import closest_miss, objective_value, pareto_front, select_best
from quantune.engine.setup import build_run
from quantune.engine.trial import Trial, TrialRecord
from quantune.report.result import Result, write_outputs
from quantune.search import create_sampler
from quantune.store import cache_key
from quantune.strategy import WAIT, Outcome, Proposal, SearchProblem, create_strategy

log = logging.getLogger("quantune")


class RunListener(Protocol):
    def on_start(self, max_trials: int | None, baseline: dict[str, float]) -> None: ...
    def on_trial(self, record: TrialRecord, best: TrialRecord | None) -> None: ...
    def on_end(self, result: Result) -> None: ...


class Engine:
    """Runs one config to its result. ``Engine(config, output_dir).run()``."""

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

    def run(self) -> Result:
        parts = build_run(self.loaded)
        config_dump = self.config.model_dump(mode="json")
        config_hash = cache_key("config", config_dump, parts.context.model.sha256)
        protected = [parts.context.model.path]
        store = open_output(self.output_dir, config_hash, restart=self.restart, protected=protected)
        (self.output_dir / "config.json").write_text(json.dumps(config_dump, indent=2))
        handler = _attach_log(self.output_dir / "quantune.log")
        try:
            return self._loop(parts, store)
        finally:
            store.close()
            _detach_log(handler)

    @property
    def objectives(self) -> list[str]:
        return list(self.config.objectives or [self.config.objective])

    def _strategy(self, parts):
        search = self.config.search
        problem = SearchProblem(
            space=parts.plan.space,
            flows=parts.plan.flows,
            subspace=parts.plan.subspace,
            make_sampler=lambda: create_sampler(search.sampler, seed=search.seed),
            max_trials=self.config.stop.max_trials,
            groups=search.groups,
            trials_per_group=search.trials_per_group,
            keep_best=search.keep_best,
        )
        strategy = create_strategy(search.strategy)
        strategy.bind(problem)
        return strategy

    def _loop(self, parts, store) -> Result:
        started = time.perf_counter()
        stop = self.config.stop
        runner = TrialRunner(parts.context)
        executor: Executor = InProcessExecutor(runner)
        strategy = self._strategy(parts)
        baseline, baseline_cache = runner.baseline()
        metric = self.config.evaluation.metric
        log.info("baseline (%s): %s", baseline_cache, baseline)
        for listener in self.listeners:
            listener.on_start(stop.max_trials, baseline)

        records: list[TrialRecord] = []
        pending: dict[Future[TrialRecord], tuple[Trial, Proposal]] = {}
        step_configs: dict[int, dict[str, Any]] = {}
        asked = 0
        stop_reason = ""
        while True:
            while not stop_reason and len(pending) < executor.capacity:
                stop_reason = self._should_stop(asked, records, started)
                if stop_reason:
                    break
                proposal = strategy.ask()
                if proposal is WAIT:
                    break
                if proposal is None:
                    stop_reason = "search finished (space exhausted or strategy done)"
                    break
                flow = proposal.flow or parts.plan.flow_of(proposal.point)
                trial = Trial(asked, tuple(flow), proposal.point)
                step_configs[trial.number] = {
                    step.id: config.model_dump(mode="json")
                    for step, config in parts.plan.configs_for(proposal.point, flow)
                }
                asked += 1
                pending[executor.submit(trial)] = (trial, proposal)
            if not pending:
                break
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                trial, proposal = pending.pop(future)
                record = future.result()
                record.stage = proposal.stage
                self._judge(record, baseline, parts.criterion, metric)
                strategy.tell(proposal, self._outcome(record))
                store.record_trial(record.to_dict())
                records.append(record)
                log.info("trial %d: %s", record.number, record.to_dict())
                best = select_best(records, self.objectives)
                for listener in self.listeners:
                    listener.on_trial(record, best)
        executor.shutdown()

        records.sort(key=lambda r: r.number)
        result = Result(
            baseline=baseline,
            trials=records,
            best=select_best(records, self.objectives),
            closest_miss=closest_miss(records, self.objectives),
            pareto_front=[r.number for r in pareto_front(records, self.objectives)] if len(self.objectives) > 1 else [],
            metric=metric,
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
            cache_stats=_cache_stats(records, baseline_cache),
            step_configs=step_configs,
        )
        write_outputs(result)
        for listener in self.listeners:
            listener.on_end(result)
        return result

    def _outcome(self, record: TrialRecord) -> Outcome:
        if record.status != "ok":
            return Outcome(None)
        return Outcome(record.objective, _violation(record), record.meets_criterion, record.metrics)

    def _should_stop(self, asked: int, records: list[TrialRecord], started: float) -> str:
        stop = self.config.stop
        met = sum(1 for r in records if r.meets_criterion)
        if stop.max_trials is not None and asked >= stop.max_trials:
            return f"max_trials ({stop.max_trials}) reached"
        if stop.timeout_s is not None and time.perf_counter() - started >= stop.timeout_s:
            return f"timeout ({stop.timeout_s:g} s) reached"
        if stop.stop_when_met and met:
            return "a trial met the criterion (stop_when_met)"
        if stop.n_candidates is not None and met >= stop.n_candidates:
            return f"{stop.n_candidates} candidate(s) found (n_candidates)"
        return ""

    def _judge(self, record: TrialRecord, baseline, criterion, metric: str) -> None:
        if record.status != "ok":
            return
        check = criterion.check(baseline[metric], record.metrics[metric])
        record.meets_criterion = check.meets
        record.accuracy_loss = check.loss
        record.objective = objective_value(record, self.objectives[0])


def _violation(record: TrialRecord) -> float:
    if record.accuracy_loss is None or record.meets_criterion:
        return 0.0
    return max(record.accuracy_loss, 1e-9)


def _cache_stats(records: list[TrialRecord], baseline_cache: str) -> dict[str, dict[str, int]]:
    stats: dict[str, dict[str, int]] = {"baseline": {"hits": 0, "misses": 0}}
    stats["baseline"]["hits" if baseline_cache == "hit" else "misses"] += 1
    for record in records:
        for step, outcome in record.cache.items():
            entry = stats.setdefault(step, {"hits": 0, "misses": 0})
            entry["hits" if outcome == "hit" else "misses"] += 1
    return stats


def _attach_log(path: Path) -> logging.Handler:
    """Sends this run's log (and onnxruntime's quantization warnings) to ``quantune.log``."""
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler


def _detach_log(handler: logging.Handler) -> None:
    logging.getLogger().removeHandler(handler)
    handler.close()
