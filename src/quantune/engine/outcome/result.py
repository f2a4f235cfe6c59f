"""The result of a run and the files that record it.

``results.json`` is the machine-readable record other tools read; its top level (``verdict``,
``verdict_reason``, ``baseline``, ``trials``, ``best``, ``time_spent_s``) is stable.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantune.engine.outcome.deploy import write_deploy
from quantune.engine.trials.trial import TrialRecord
from quantune.evaluate.criterion import Criterion
from quantune.evaluate.session_file import session_file
from quantune.machine import machine_info
from quantune.model import external_data_files

log = logging.getLogger("quantune")


@dataclass
class Result:
    baseline: dict[str, float]
    trials: list[TrialRecord]
    best: TrialRecord | None
    closest_miss: TrialRecord | None
    pareto_front: list[int]
    metric: str
    criterion: Criterion
    objective: str
    objectives: list[str]
    stop_reason: str
    duration_s: float
    output_dir: Path
    cache_stats: dict[str, dict[str, int]] = field(default_factory=dict)
    step_configs: dict[int, dict[str, Any]] = field(default_factory=dict, repr=False)
    replayed: int = 0
    latency_confirmation: dict[str, Any] | None = None  # trials re-timed side by side with the original
    verdict: str = "no_candidate_in_budget"  # improved | unconfirmed | keep_original | no_candidate_in_budget
    verdict_reason: str = ""
    preparation: dict[str, Any] | None = None  # what model preparation changed (quantune.prepare)
    skipped_known_failures: int = 0  # proposals not run: they shared a known failure's signature
    stage_peak_rss_mb: dict[str, float] = field(default_factory=dict)  # sensitivity, calibration, baseline_evaluation
    stage_errors: list[dict[str, Any]] = field(default_factory=list)  # stages that died, with their cause
    strategy_notes: dict[str, Any] = field(default_factory=dict)  # Strategy.learned(): sensitivity scores
    environment: dict[str, Any] = field(default_factory=machine_info)  # the machine and library versions
    target: dict[str, Any] | None = None  # where models were evaluated: versions, provider, CPU
    latency_confirmation_skipped: str | None = None  # why the run's end did not re-time its best models
    miss_front: list[int] = field(default_factory=list)  # selection.miss_front: the closest miss first
    time_spent_s: dict[str, float] = field(default_factory=dict)  # phase -> seconds (engine/run/timebook.py)
    time_left_s: float | None = field(default=None, repr=False)  # of stop.timeout_s; not in results.json
    model_not_saved: str | None = None  # why the chosen model's folder was not written (it left the cache)

    @property
    def failure_classes(self) -> dict[str, int]:
        """Failed trials per failure class (see engine/trials/failures.py), most frequent first."""
        counts: dict[str, int] = {}
        for record in self.trials:
            if record.status == "failed":
                name = record.failure_class or "unclassified"
                counts[name] = counts.get(name, 0) + 1
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))

    @property
    def interrupted(self) -> bool:
        return self.stop_reason.startswith("interrupted")

    @property
    def improved(self) -> bool:
        return self.verdict == "improved" and self.best is not None

    @property
    def best_model_path(self) -> Path | None:
        """``best/model.onnx``, written only when a candidate beat the original (else ``None``)."""
        return self.output_dir / "best" / "model.onnx" if self.improved and not self.model_not_saved else None

    @property
    def provider_front(self) -> dict[str, int]:
        """Per provider (``target.providers``), the trial number of its fastest trial in budget by its own figure."""
        target = self.target or {}
        if not target.get("providers"):
            return {}
        fastest: dict[str, TrialRecord] = {}
        for record in self.trials:
            where = str((record.session_settings or {}).get("provider", target.get("provider")))
            if not record.meets_criterion or record.objective is None:
                continue
            if where not in fastest or record.objective < (fastest[where].objective or 0.0):
                fastest[where] = record
        return {provider: record.number for provider, record in fastest.items()}

    def miss_front_rows(self) -> list[dict[str, Any]]:
        """:attr:`miss_front` as rows a user chooses from: the metric, the loss, the speed-up over the original."""
        by_number = {r.number: r for r in self.trials}
        base = self.baseline.get("latency_ms") or 0.0
        rows = []
        for number in self.miss_front:
            record = by_number[number]
            latency = record.metrics.get("latency_ms", 0.0)
            rows.append(
                {
                    "number": number,
                    self.metric: record.metrics.get(self.metric),
                    "accuracy_loss": record.accuracy_loss,
                    "latency_ms": latency,
                    "speedup": base / latency if latency > 0 else None,
                }
            )
        return rows

    @property
    def unconfirmed_model_path(self) -> Path | None:
        """``unconfirmed/model.onnx``: the candidate faster by the search's figures, not yet timed side by side."""
        unconfirmed = self.verdict == "unconfirmed" and self.best is not None and not self.model_not_saved
        return self.output_dir / "unconfirmed" / "model.onnx" if unconfirmed else None

    @classmethod
    def from_json(cls, data: Mapping[str, Any], output_dir: str | Path) -> Result:
        """The run a results.json records (typed), ``output_dir`` its folder; missing keys take their defaults."""
        trials = [TrialRecord.from_dict(t) for t in data["trials"]]
        objective = data.get("objective", "latency")
        return cls(
            baseline=dict(data["baseline"]),
            trials=trials,
            best=TrialRecord.from_dict(data["best"]) if data.get("best") else None,
            closest_miss=TrialRecord.from_dict(data["closest_miss"]) if data.get("closest_miss") else None,
            pareto_front=list(data.get("pareto_front") or []),
            metric=data["metric"],
            criterion=Criterion.from_json(data["criterion"]),
            objective=objective,
            objectives=list(data.get("objectives") or [objective]),
            stop_reason=data.get("stop_reason", ""),
            duration_s=float(data.get("duration_s", 0.0)),
            output_dir=Path(output_dir),
            cache_stats=dict(data.get("cache") or {}),
            replayed=int(data.get("replayed_trials", 0)),
            latency_confirmation=data.get("latency_confirmation"),
            verdict=data.get("verdict", "no_candidate_in_budget"),
            verdict_reason=data.get("verdict_reason", ""),
            preparation=data.get("preparation"),
            skipped_known_failures=int(data.get("skipped_known_failures", 0)),
            stage_peak_rss_mb=dict(data.get("stage_peak_rss_mb") or {}),
            stage_errors=list(data.get("stage_errors") or []),
            strategy_notes=dict(data.get("strategy") or {}),
            environment=dict(data.get("environment") or {}),
            target=data.get("target"),
            latency_confirmation_skipped=data.get("latency_confirmation_skipped"),
            miss_front=[row["number"] for row in data.get("closest_miss_front") or []],
            time_spent_s=dict(data.get("time_spent_s") or {}),
            model_not_saved=data.get("model_not_saved"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "verdict_reason": self.verdict_reason,
            "baseline": self.baseline,
            "trials": [record.to_dict() for record in self.trials],
            "best": self.best.to_dict() if self.best else None,
            "closest_miss": None if self.best or not self.closest_miss else self.closest_miss.to_dict(),
            "metric": self.metric,
            "criterion": self.criterion.to_json(),
            "objective": self.objective,
            "objectives": self.objectives,
            "pareto_front": self.pareto_front,
            "provider_front": self.provider_front,
            "closest_miss_front": [] if self.best else self.miss_front_rows(),
            "stop_reason": self.stop_reason,
            "duration_s": self.duration_s,
            "cache": self.cache_stats,
            "replayed_trials": self.replayed,
            "latency_confirmation": self.latency_confirmation,
            "preparation": self.preparation,
            "failure_classes": self.failure_classes,
            "skipped_known_failures": self.skipped_known_failures,
            "stage_peak_rss_mb": self.stage_peak_rss_mb,
            "stage_errors": self.stage_errors,
            "strategy": self.strategy_notes,
            "environment": self.environment,
            "target": self.target,
            "latency_confirmation_skipped": self.latency_confirmation_skipped,
            "time_spent_s": self.time_spent_s,
            "model_not_saved": self.model_not_saved,
        }


def write_outputs(
    result: Result,
    before_json: Callable[[], None] | None = None,
    rebuild: Callable[[TrialRecord], Path | None] | None = None,
) -> None:
    """Writes ``results.json`` and the model that answers the run.

    ``best/`` only when ``improved``, ``unconfirmed/`` for a candidate not yet timed side by side,
    ``closest_miss/`` when nothing met the criterion, none when the original should stay (a user
    deploying ``best/`` gets only confirmed wins). ``before_json`` runs once the models are saved;
    ``rebuild`` builds the chosen model again when it left the cache during the run.
    """
    folder = result.output_dir
    folder.mkdir(parents=True, exist_ok=True)
    result.model_not_saved = None  # this pass's finding (an earlier pass over the run may have had one)
    chosen, kind = None, "best"
    if result.improved:
        chosen = result.best
    elif result.unconfirmed_model_path is not None:
        chosen, kind = result.best, "unconfirmed"
    elif result.best is None:
        chosen, kind = result.closest_miss, "closest_miss"
    for other in {"best", "unconfirmed", "closest_miss"} - ({kind} if chosen is not None else set()):
        shutil.rmtree(folder / other, ignore_errors=True)  # from an earlier pass over this run
    _say_lost_models(result)
    if chosen is not None and chosen.model_path:
        _save_model(folder / kind, chosen, result, rebuild)
    if before_json is not None:
        before_json()
    tmp = folder / ".results.json.tmp"
    tmp.write_text(json.dumps(result.to_dict(), indent=2, default=str))
    os.replace(tmp, folder / "results.json")


def _say_lost_models(result: Result) -> None:
    """Says, on the console too, which finished trials' models left the cache during the run."""
    lost = [r.number for r in result.trials if r.status == "ok" and r.model_path and not Path(r.model_path).is_file()]
    if lost:
        numbers = ", ".join(map(str, lost[:10])) + (", ..." if len(lost) > 10 else "")
        message = (
            f"the models of trials {numbers} left the cache during the run (cache_dir cleared?): they were "
            "not timed again; run the same command again to rebuild and compare them"
        )
        log.warning(message)
        print(f"quantune: warning: {message}", file=sys.stderr)


def _save_model(
    target: Path, chosen: TrialRecord, result: Result, rebuild: Callable[[TrialRecord], Path | None] | None
) -> None:
    """``target``/model.onnx (with its external data) and params.json, always as a matching pair."""
    source = Path(str(chosen.model_path))
    if not source.is_file() and rebuild is not None:  # a cache miss rebuilds: the same bytes, or nothing
        rebuilt = rebuild(chosen)
        if rebuilt is not None:
            log.info("trial %d's model left the cache during the run: built again (%s)", chosen.number, rebuilt)
            source = rebuilt
            chosen.model_path = str(rebuilt)
    if not source.is_file():
        # The cache was cleared during the run: no earlier pair may stand in for the model.
        shutil.rmtree(target, ignore_errors=True)
        result.model_not_saved = (
            f"trial {chosen.number}'s model left the cache during the run ({source}): {target.name}/ is not "
            "written; run the same command again to rebuild it"
        )
        log.warning(result.model_not_saved)
        print(f"quantune: warning: {result.model_not_saved}", file=sys.stderr)
        return
    shutil.rmtree(target, ignore_errors=True)  # no file of an earlier best (its external data) may stay beside this one
    target.mkdir()
    shutil.copyfile(source, target / "model.onnx")
    for data in external_data_files(source):  # weights saved beside the model travel with it
        destination = target / data.relative_to(source.parent)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(data, destination)
    if session_file(source).is_file():  # the session settings it was measured with (session_tuning)
        shutil.copyfile(session_file(source), session_file(target / "model.onnx"))
    params = {
        "trial": chosen.number,
        "flow": chosen.flow,
        "params": chosen.params,
        "pass_configs": result.step_configs.get(chosen.number, {}),
        "metrics": chosen.metrics,
        "meets_criterion": chosen.meets_criterion,
        "session_settings": chosen.session_settings,
    }
    (target / "params.json").write_text(json.dumps(params, indent=2, default=str))
    write_deploy(target, chosen, result.target)  # session.json and run.py: as measured
