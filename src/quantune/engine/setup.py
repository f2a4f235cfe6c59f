"""Turns a validated config into the parts of a run, checking every file it names."""

from __future__ import annotations

from dataclasses import dataclass

from quantune.config import LoadedConfig
from quantune.data import Dataset, load_dataset
from quantune.engine.identity import run_sources
from quantune.engine.plan import Plan, build_plan
from quantune.engine.runner import RunContext
from quantune.errors import ConfigError
from quantune.evaluate import (
    AGREEMENT_METRICS,
    LABEL_METRICS,
    Criterion,
    EvaluationSpec,
    Evaluator,
    LatencySpec,
    metric_direction,
)
from quantune.model import ModelHandle, file_sha256
from quantune.store import ArtifactCache, default_cache_dir
from quantune.userimport import load_function, load_plugins


@dataclass(frozen=True)
class RunParts:
    context: RunContext
    criterion: Criterion
    plan: Plan


def build_run(loaded: LoadedConfig, *, eval_threads: int = 0) -> RunParts:
    """``eval_threads``: onnxruntime threads for accuracy evaluation (0: all cores)."""
    config = loaded.config
    load_plugins(config.plugins, loaded.base_dir)
    model = ModelHandle.from_path(loaded.resolve(config.model), field_name="model")
    plan = build_plan(config, nodes=model.nodes)
    needs_calibration = [step.id for step in plan.steps.values() if step.pass_cls.needs_calibration]
    calibration: Dataset | None = None
    if config.data.calibration:
        calibration = load_dataset(config.data.calibration, field_name="data.calibration", base_dir=loaded.base_dir)
    elif needs_calibration:
        raise ConfigError(f"data.calibration: passes {needs_calibration} need calibration data; name an .npz file")
    evaluation = load_dataset(config.data.evaluation, field_name="data.evaluation", base_dir=loaded.base_dir)
    input_names = model.input_names()
    evaluation.inputs(input_names)
    if calibration is not None:
        calibration.inputs(input_names)

    metric = config.evaluation.metric
    user_metric = None
    metric_source = None
    if ".py:" in metric:
        user_metric = load_function(metric, "evaluation.metric", loaded.base_dir)
        metric_source = file_sha256(loaded.resolve(metric.rpartition(":")[0]))
        default_direction = True
    elif metric in LABEL_METRICS or metric in AGREEMENT_METRICS:
        default_direction = metric_direction(metric)
    else:
        allowed = sorted(LABEL_METRICS) + sorted(AGREEMENT_METRICS)
        raise ConfigError(f"evaluation.metric: unknown metric '{metric}'; use one of {allowed} or 'script.py:function'")
    latency = config.evaluation.latency
    spec = EvaluationSpec(
        metric=metric,
        batch_size=config.data.batch_size,
        label_key=config.data.label_key,
        latency=LatencySpec(latency.warmup, latency.repeats, latency.threads, latency.batch_size),
        user_metric=user_metric,
        metric_source_sha256=metric_source,
    )
    evaluator = Evaluator(spec, evaluation, input_names, threads=eval_threads)
    higher = config.criterion.higher_is_better
    criterion = Criterion(
        kind=config.criterion.type,
        tolerable_loss=config.criterion.tolerable_loss,
        higher_is_better=default_direction if higher is None else higher,
    )
    cache = ArtifactCache(loaded.resolve(config.cache_dir) if config.cache_dir else default_cache_dir())
    context = RunContext(model, plan, calibration, evaluator, cache, config.data.batch_size)
    context.sources = run_sources(loaded, context)
    return RunParts(context, criterion, plan)
