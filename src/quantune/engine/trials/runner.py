"""Runs one trial: each pass through the cache, then the evaluation through the cache.

A :class:`TrialRunner` holds what every trial of a run shares (model, data, evaluator,
cache) and is built once per worker process; executors only decide where ``run`` is called.
"""

from __future__ import annotations

import logging
import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from quantune.data import Dataset
from quantune.engine.plan.plan import Plan
from quantune.engine.trials.identity import check_model_unchanged
from quantune.engine.trials.selection import is_candidate, miss_front
from quantune.engine.trials.trial import Trial, TrialRecord
from quantune.errors import QuantuneError, TrialError
from quantune.evaluate import Criterion, Evaluator
from quantune.evaluate.session_file import read_session_settings
from quantune.memory import peak_tracker, take_stage_peaks
from quantune.model import ModelHandle
from quantune.passes.cached import run_flow_cached
from quantune.passes.timing import timing_for
from quantune.prepare import Preparation
from quantune.store import ArtifactCache, cache_key

log = logging.getLogger("quantune.runner")

UNTIMED = "misses the accuracy budget: timed only if it may be the closest miss, at the run's end"


@dataclass
class RunContext:
    """Everything shared by the trials of one run: ``model`` is the original, the thing to beat;
    trials start from ``prepared`` when preparation changed it."""

    model: ModelHandle
    plan: Plan
    calibration: Dataset | None
    evaluator: Evaluator
    cache: ArtifactCache
    batch_size: int  # rows per calibration batch
    # "miss" once this process computed the baseline, so a later cache hit still reports it
    baseline_status: str | None = None
    # config field -> {"label", "fingerprint"}: the content of the model, data and scripts (identity.py)
    sources: dict[str, dict[str, str]] = field(default_factory=dict)
    prepared: ModelHandle | None = None
    preparation: Preparation | None = None
    # called once before / after the speed ceilings are timed
    before_ceilings: Callable[[], None] | None = None
    after_ceilings: Callable[[], None] | None = None
    # set until the speed ceilings have timed the original: takes those runs' seconds as its latency
    original_timed: Callable[[Any], None] | None = None

    @property
    def start(self) -> ModelHandle:
        return self.prepared or self.model

    def eval_key(self, model_sha: str) -> str:
        """The evaluation cache key: model, evaluation, data, original and user scripts (an edited
        metric never reuses old figures)."""
        from quantune.engine.trials.identity import fingerprints

        spec = self.evaluator.spec
        return cache_key(
            "eval",
            model_sha,
            spec.fingerprint(),
            self.evaluator.dataset.fingerprint,
            self.model.sha256,
            fingerprints(self.sources, evaluation_only=True),
            self.evaluator.backend.fingerprint(),  # provider, its options, onnxruntime build (target)
        )

    def baseline_keys(self) -> tuple[str, str, str]:
        """The original's cache keys: its figures, its outputs and its metric."""
        key = self.eval_key(self.model.sha256)
        return key, cache_key("reference", key), cache_key("reference-metric", key)


class TrialRunner:
    def __init__(self, context: RunContext) -> None:
        self.context = context
        self._reference: dict[str, Any] | None = None
        self.run_id = ""  # the engine run this runner works for (WorkerSpec.run_id)
        self.criterion: Criterion | None = None  # the run's, where a worker judges (engine/measure/ahead.py)

    def baseline(self, *, quick_timing: bool = False) -> tuple[dict[str, float], str]:
        """The original model's figures (cached), and whether they came from the cache.

        ``quick_timing``: timed in a few rounds; the engine times the original again before using it.
        """
        ctx = self.context
        key, reference_key, metric_key = ctx.baseline_keys()
        cached = ctx.cache.get_json("evals", key)
        reference = ctx.cache.get_arrays(reference_key)
        if cached is not None and reference is not None:
            self._reference = reference
            return cached["metrics"], ctx.baseline_status or "hit"
        try:
            # the reference is cached before the original is timed, so a first guess can compare meanwhile
            started = time.perf_counter()
            evaluated: list[float] = []

            def keep(packed: dict[str, Any], metric: dict[str, float]) -> None:
                evaluated.append(time.perf_counter() - started)  # outputs and metric, before timing and memory
                # the metric first: the outputs' file is what a guess beside it waits for
                ctx.cache.put_json("evals", metric_key, {"metrics": metric})
                ctx.cache.put_arrays(reference_key, packed)

            ctx.evaluator.quick_timing = quick_timing
            metrics, outputs = ctx.evaluator.evaluate(ctx.model.path, None, on_outputs=keep)
        except TrialError as exc:  # nothing can be compared to a reference that does not evaluate
            raise QuantuneError(f"evaluating the original model failed: {exc}") from None
        finally:
            ctx.evaluator.quick_timing = False
        # the evaluation's and the timing's seconds: trial limits and run estimates derive from them
        seconds = {
            "evaluation_s": evaluated[0] if evaluated else time.perf_counter() - started,
            "timing_s": ctx.evaluator.last_timing_s,
        }
        ctx.cache.put_json(
            "evals", key, {"metrics": metrics, **seconds, **({"quick_timing": True} if quick_timing else {})}
        )
        self._reference = outputs
        ctx.baseline_status = "miss"
        return metrics, "miss"

    def reference(self) -> dict[str, Any]:
        if self._reference is None:
            self.baseline()
        assert self._reference is not None
        return self._reference

    def run(self, trial: Trial) -> TrialRecord:
        record = TrialRecord(number=trial.number, flow=list(trial.flow), params=dict(trial.params), status="ok")
        started = time.perf_counter()
        take_stage_peaks()  # only this trial's stages
        with peak_tracker() as peak:
            try:
                check_model_unchanged(self.context)  # a model file replaced meanwhile is never built from
                for attempt in (1, 2):
                    model_path, model_sha = self._run_passes(trial, record)
                    record.model_path = str(model_path)
                    record.model_sha256 = model_sha
                    try:
                        record.session_settings = read_session_settings(model_path)
                        record.metrics = self._evaluate(model_path, model_sha, record, trial.untimed_if_missed)
                        break
                    except Exception:
                        if attempt == 2 or model_path.is_file():
                            raise
                        # the cache was cleared under the model it built: build it again, once
                        log.warning(
                            "trial %d: its model left the cache (%s); building it again", trial.number, model_path
                        )
            except Exception as exc:  # a trial's failure is data, not a crash of the run
                record.status = "failed"
                record.error = f"{type(exc).__name__}: {exc}"
                log.warning("trial %d failed: %s\n%s", trial.number, record.error, traceback.format_exc())
        record.durations["total_s"] = time.perf_counter() - started
        record.peak_rss_mb = round(peak.mb, 1)
        for stage, mb in take_stage_peaks().items():  # e.g. a calibration the trial ran
            record.durations[f"{stage}_peak_rss_mb"] = mb
        return record

    def time_closest_misses(self, records: list[TrialRecord], original_ms: float | None) -> list[TrialRecord]:
        """With no candidate in budget, the untimed misses timed now, most accurate first, until the
        closest miss is known: a miss less accurate than a faster timed one cannot be it. Returns the
        records timed."""
        if any(is_candidate(r) for r in records):
            return []
        timed = []
        misses = (r for r in records if r.untimed and r.accuracy_loss is not None)
        for record in sorted(misses, key=lambda r: (r.accuracy_loss, r.number)):
            front = miss_front(records, original_ms)
            if front and front[0].accuracy_loss < record.accuracy_loss:  # (a tie: the tie rule reads its speed)
                break
            path = Path(record.model_path or "")
            path = path if path.is_file() else self.rebuild(record)
            if path is None:
                continue
            record.metrics.update(self.context.evaluator.speed_figures(path))
            record.untimed = None
            timed.append(record)
        return timed

    def rebuild(self, record: TrialRecord) -> Path | None:
        """A finished trial's model built again when it left the cache; ``None`` when the passes fail
        or do not give the same bytes."""
        scratch = TrialRecord(number=record.number, flow=list(record.flow), params=dict(record.params), status="ok")
        try:
            path, sha = self._run_passes(Trial(record.number, tuple(record.flow), dict(record.params)), scratch)
        except Exception as exc:
            log.warning("trial %d: its model could not be built again (%s)", record.number, exc)
            return None
        if sha != record.model_sha256:
            log.warning("trial %d: its model built again is not the same model (sha256 %s)", record.number, sha)
            return None
        return path

    def _run_passes(self, trial: Trial, record: TrialRecord) -> tuple[Path, str]:
        ctx = self.context
        start = ctx.start
        pass_times: dict[str, float] = {}

        def note(step_id: str, hit: bool, seconds: float) -> None:
            record.cache[step_id] = "hit" if hit else "miss"
            pass_times[step_id] = seconds

        current, current_sha = run_flow_cached(
            ctx.cache,
            [(step.id, step.pass_cls, config) for step, config in ctx.plan.configs_for(trial.params, trial.flow)],
            start.path,
            start.sha256,
            calibration=ctx.calibration,
            input_names=ctx.evaluator.input_names,
            batch_size=ctx.batch_size,
            external_data=start.external_data,
            check_input=partial(check_model_unchanged, ctx) if start.path == ctx.model.path else None,
            on_step=note,
            timing=timing_for(ctx.evaluator),
        )
        record.durations["passes_s"] = pass_times
        return current, current_sha

    def _evaluate(
        self, model_path: Path, model_sha: str, record: TrialRecord, untimed_if_missed: bool = False
    ) -> dict[str, float]:
        ctx = self.context
        key = ctx.eval_key(model_sha)
        started = time.perf_counter()
        cached = ctx.cache.get_json("evals", key)
        timed = partial(self._timed, untimed_if_missed)
        if cached is not None:
            # computed ahead by this very run: its work, not a hit
            ahead = bool(self.run_id) and cached.get("ahead") == self.run_id
            record.cache["evaluation"] = "miss" if ahead else "hit"
            metrics = cached["metrics"]
            if "latency_ms" not in metrics and timed(metrics):  # left untimed before, wanted now
                metrics = {**metrics, **ctx.evaluator.speed_figures(model_path)}
                ctx.cache.put_json("evals", key, {**cached, "metrics": metrics})
        else:
            if self._reference is None:
                self.baseline()
            metrics, _ = ctx.evaluator.evaluate(model_path, self._reference, timed=timed)
            ctx.cache.put_json("evals", key, {"metrics": metrics})
            record.cache["evaluation"] = "miss"
        if "latency_ms" not in metrics:
            record.untimed = UNTIMED
        record.durations["evaluation_s"] = time.perf_counter() - started
        score = metrics.get(ctx.evaluator.spec.metric)
        if isinstance(score, float) and math.isnan(score):  # no criterion, no sampler can rank it
            raise TrialError(f"metric '{ctx.evaluator.spec.metric}' returned NaN for this model")
        return metrics

    def _timed(self, untimed_if_missed: bool, figures: dict[str, float]) -> bool:
        """Whether a model with ``figures`` is timed: always, unless its trial may leave a miss untimed
        (:attr:`Trial.untimed_if_missed`) and it misses the run's criterion against the original."""
        metric = self.context.evaluator.spec.metric
        if not untimed_if_missed or self.criterion is None or metric not in figures:
            return True
        original = original_metric(self.context, metric, 0.0)
        return original is None or bool(self.criterion.check(original, figures[metric]).meets)


def original_metric(context: RunContext, metric: str, wait_s: float) -> float | None:
    """The original's ``metric`` from the cache (with its outputs, else its figures), polled for up
    to ``wait_s`` while another process writes it."""
    key, _, metric_key = context.baseline_keys()
    deadline = time.perf_counter() + wait_s
    while True:
        for record_key in (key, metric_key):
            value = ((context.cache.get_json("evals", record_key) or {}).get("metrics") or {}).get(metric)
            if value is not None:
                return float(value)
        if time.perf_counter() >= deadline:
            return None
        time.sleep(0.05)
