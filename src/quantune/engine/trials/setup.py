"""Turns a validated config into the parts of a run, checking every file it names."""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from quantune.config import Config, LoadedConfig
from quantune.convert import describe_export, export_pytorch
from quantune.data import Dataset, load_dataset
from quantune.data.preflight import DataChecks, check_data, model_inputs
from quantune.engine.plan.plan import Plan, build_plan
from quantune.engine.trials.identity import run_sources
from quantune.engine.trials.runner import RunContext, TrialRunner
from quantune.engine.trials.target import target_backend
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
from quantune.evaluate.criterion import check_budget
from quantune.evaluate.metric_registry import find_metric, metric_names
from quantune.evaluate.metric_registry import metric_source as metric_source_of
from quantune.evaluate.quantized import QUANTIZED_COMPUTE_OPS
from quantune.model import ModelHandle, file_sha256
from quantune.passes import get_pass, pass_names
from quantune.prepare import Preparation, PrepareOptions, prepare_model, unprepared
from quantune.store import ArtifactCache, default_cache_dir
from quantune.userimport import load_function, load_plugins

log = logging.getLogger("quantune.setup")


@dataclass(frozen=True)
class Given:
    """Parts a worker receives instead of computing them again: the engine's checked data, its
    preparation, and the names the engine gives its metric and runner (so figures match)."""

    calibration: Dataset | None
    evaluation: Dataset
    preparation: Preparation
    metric: str
    runner: str | None = None


@dataclass(frozen=True)
class RunParts:
    context: RunContext
    criterion: Criterion
    plan: Plan


def build_run(loaded: LoadedConfig, *, eval_threads: int = 0, given: Given | None = None) -> RunParts:
    """``eval_threads``: onnxruntime threads for accuracy evaluation (0: all cores); ``given``: the
    data and preparation a worker received (a cluster node without the engine's files)."""
    config = loaded.config
    load_plugins(config.plugins, loaded.base_dir)
    if isinstance(config.model, str):
        model = ModelHandle.from_path(loaded.resolve(config.model), field_name="model")
        check_not_quantized(config.model, model, build_plan(config, nodes=model.nodes))
        cache = ArtifactCache(loaded.resolve(config.cache_dir) if config.cache_dir else default_cache_dir())
        calibration, evaluation = (given.calibration, given.evaluation) if given else _load_data(loaded)
    else:  # a PyTorch model: its export reads the data's shapes (dynamic axes), so the data comes first
        cache = ArtifactCache(loaded.resolve(config.cache_dir) if config.cache_dir else default_cache_dir())
        calibration, evaluation = _load_data(loaded)
        datasets = [data for data in (evaluation, calibration) if data is not None]
        exported = export_pytorch(config.model, loaded.base_dir, cache, datasets, config.data.batch_size)
        model = ModelHandle.from_path(exported, field_name="model")
    input_names = model.input_names()
    calibration, evaluation = check_run_data(config, model, calibration, evaluation)
    preparation = given.preparation if given else prepare_for_run(config, model, evaluation, cache)
    if not isinstance(config.model, str):  # the export is the first change made to what the user gave
        preparation.steps.insert(0, describe_export(model.path))
    start = model if preparation.model == model.path else prepared_handle(preparation)
    plan = build_plan(config, nodes=start.nodes, facts=preparation.facts)
    needs_calibration = [step.id for step in plan.steps.values() if step.pass_cls.needs_calibration]
    if calibration is None and needs_calibration:
        raise ConfigError(f"data.calibration: passes {needs_calibration} need calibration data; name an .npz file")

    metric = config.evaluation.metric
    user_metric = None
    metric_source = None
    if ".py:" in metric:
        user_metric = load_function(metric, "evaluation.metric", loaded.base_dir)
        metric_source = file_sha256(loaded.resolve(metric.rpartition(":")[0]))
        default_direction = True
    elif metric in LABEL_METRICS or metric in AGREEMENT_METRICS:
        default_direction = metric_direction(metric)
    elif (added := find_metric(metric)) is not None:
        user_metric, metric_source = added, metric_source_of(metric, added)
        default_direction = bool(getattr(added, "higher_is_better", True))
    else:
        raise ConfigError(
            f"evaluation.metric: unknown metric '{metric}'; use one of {metric_names()} or 'script.py:function'"
        )
    latency = config.evaluation.latency
    runner, runner_source = None, None
    if config.evaluation.runner is not None:
        runner_spec = config.evaluation.runner
        if ".py:" not in runner_spec:
            raise ConfigError(f"evaluation.runner: '{runner_spec}' is not 'path/to/script.py:function'")
        runner = load_function(runner_spec, "evaluation.runner", loaded.base_dir)
        runner_source = file_sha256(loaded.resolve(runner_spec.rpartition(":")[0]))
    spec = EvaluationSpec(
        metric=given.metric if given else metric,
        batch_size=config.data.evaluation_batch_size or config.data.batch_size,
        label_key=config.data.label_key,
        latency=LatencySpec(
            latency.warmup,
            latency.repeats,
            config.target.threads or latency.threads,
            latency.batch_size,
            latency.feed,
            latency.seconds,
        ),
        user_metric=user_metric,
        metric_source_sha256=metric_source,
        runner=runner,
        runner_name=given.runner if given else config.evaluation.runner,
        runner_source_sha256=runner_source,
        quantized_ops=frozenset().union(*(step.pass_cls.leaves_quantized for step in plan.steps.values())),
    )
    evaluator = Evaluator(spec, evaluation, input_names, threads=eval_threads, backend=target_backend(loaded))
    higher = config.criterion.higher_is_better
    criterion = Criterion(
        kind=config.criterion.type,
        tolerable_loss=config.criterion.tolerable_loss,
        higher_is_better=default_direction if higher is None else higher,
    )
    calibration_batch = config.data.calibration_batch_size or config.data.batch_size
    context = RunContext(
        model, plan, calibration, evaluator, cache, calibration_batch, prepared=start, preparation=preparation
    )
    context.sources = run_sources(loaded, context)
    return RunParts(context, criterion, plan)


# Ops only a quantized model holds: the QDQ form's (de)quantizers, the QOperator and integer kernels.
QUANTIZED_INPUT_OPS = QUANTIZED_COMPUTE_OPS | {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}


def check_not_quantized(label: str, model: ModelHandle, plan: Plan) -> None:
    """A quantized model given as input is refused when a pass would quantize it again: onnxruntime's
    quantizers do not take their own output."""
    found = Counter(op for _, op in model.nodes() if op in QUANTIZED_INPUT_OPS)
    quantizers = sorted({step.pass_cls.name for step in plan.steps.values() if step.pass_cls.quantizes})
    if not found or not quantizers:
        return
    form = "QDQ" if {"QuantizeLinear", "DequantizeLinear"} & found.keys() else "QOperator"
    ops = ", ".join(f"{count} {op}" for op, count in found.most_common(3))
    others = [name for name in pass_names() if get_pass(name).role in ("optimize", "tune")]
    raise ConfigError(
        f"model: '{label}' is quantized already ({form} form: {ops}); passes {quantizers} cannot quantize "
        "it again. Give the float32 model it was quantized from, or keep only passes that do not quantize "
        f"(e.g. {', '.join(others)}) to tune the quantized model as it is"
    )


def _load_data(loaded: LoadedConfig) -> tuple[Dataset | None, Dataset]:
    data = loaded.config.data
    evaluation = _load(loaded, data.evaluation, "data.evaluation")
    calibration = _load(loaded, data.calibration, "data.calibration") if data.calibration else None
    return calibration, evaluation


def _load(loaded: LoadedConfig, spec: str, field_name: str) -> Dataset:
    """A data source; a loader script that never returns ends the process with one line (limits.py)."""
    if ".py:" not in spec:
        return load_dataset(spec, field_name=field_name, base_dir=loaded.base_dir)
    from quantune.engine.trials.limits import limit_source, original_limit, watchdog

    limit = original_limit(loaded.config)
    message = (
        f"{field_name}: '{spec}' did not return within {limit:g} s ({limit_source(loaded.config)}); "
        "a data loader must return its arrays"
    )
    with watchdog(limit, message):
        return load_dataset(spec, field_name=field_name, base_dir=loaded.base_dir)


def for_workers(loaded: LoadedConfig, parts: RunParts) -> LoadedConfig:
    """The config workers rebuild the run from: a PyTorch model replaced by its ONNX export."""
    if isinstance(loaded.config.model, str):
        return loaded
    config = loaded.config.model_copy(update={"model": str(parts.context.model.path)})
    return LoadedConfig(config, loaded.base_dir, loaded.source)


def check_run_data(
    config: Config, model: ModelHandle, calibration: Dataset | None, evaluation: Dataset
) -> tuple[Dataset | None, Dataset]:
    """Both data sources checked against the model's inputs, converted where a dtype allows."""
    data = config.data
    inputs = model_inputs(model.path)

    def batch_field(own: str, value: int | None) -> dict[str, int]:
        return {f"data.{own}" if value else "data.batch_size": value or data.batch_size}

    if calibration is not None:
        checks = DataChecks(
            f"data.calibration ('{data.calibration}')",
            batch_field("calibration_batch_size", data.calibration_batch_size),
        )
        calibration = check_data(calibration, inputs, checks)
    sizes = batch_field("evaluation_batch_size", data.evaluation_batch_size)
    if config.evaluation.latency.batch_size:
        sizes["evaluation.latency.batch_size"] = config.evaluation.latency.batch_size
    labels = data.label_key if config.evaluation.metric in LABEL_METRICS else None
    driven = config.evaluation.runner is not None
    checks = DataChecks(f"data.evaluation ('{data.evaluation}')", sizes, labels, runner=driven)
    evaluation = check_data(evaluation, inputs, checks)
    return calibration, evaluation


def preflight(parts: RunParts, baseline: Callable[[], dict[str, float]] | None = None) -> dict[str, float]:
    """The original model evaluated before the output folder is claimed: the data runs through it,
    the metric is a finite number and the budget makes sense. The figures are cached for the
    run's baseline. ``baseline`` computes them; by default, here."""
    metrics = baseline() if baseline is not None else TrialRunner(parts.context).baseline()[0]
    metric = parts.context.evaluator.spec.metric
    value = metrics.get(metric)
    if value is None or not math.isfinite(value):
        raise ConfigError(
            f"evaluation.metric: '{metric}' gave {value} on the original model; it must return a finite number"
        )
    check_budget(parts.criterion, metric, metrics)  # a budget no candidate can meet, or one the data cannot resolve
    return metrics


# Evaluation rows the prepared model is checked on: enough to catch a broken step, yet cheap on a
# heavy model. A batch dimension the model leaves open is checked on a slice of a batch; a fixed one
# needs its whole batch.
CHECK_ROWS = 2


def prepare_for_run(config: Config, model: ModelHandle, evaluation: Dataset, cache: ArtifactCache) -> Preparation:
    """The model trials start from: prepared (``prepare: auto``) and checked on a few evaluation rows,
    or the original as it is (``prepare: off``)."""
    if config.prepare == "off":
        return unprepared(model)
    passes = [get_pass(entry.name, field_name=f"passes[{i}].name") for i, entry in enumerate(config.passes)]
    opset = max((pass_cls.min_opset for pass_cls in passes), default=0)
    inputs = model_inputs(model.path)
    present = [spec for spec in inputs if evaluation.has(spec.name)]
    batch = config.data.evaluation_batch_size or config.data.batch_size
    if all(spec.dims and spec.dims[0] is None for spec in present):
        batch = min(batch, CHECK_ROWS)
    rows = -(-CHECK_ROWS // batch) * batch
    feeds = list(evaluation.batches([spec.name for spec in present], batch, limit=rows))
    # Inputs a runner supplies (a recurrent state) are not in the data: zeros will do for the check.
    missing = [spec for spec in inputs if not evaluation.has(spec.name)]
    if not missing:
        return prepare_model(model, feeds, cache, PrepareOptions(opset=opset))
    if any(spec.dims is None or spec.dtype is None for spec in missing):
        log.warning("prepare: skipped, inputs %s are not in the data and their shape is unknown", missing)
        return unprepared(model)
    zeros = {spec.name: np.zeros([dim or 1 for dim in spec.dims], spec.dtype) for spec in missing}
    try:
        return prepare_model(model, [{**feed, **zeros} for feed in feeds], cache, PrepareOptions(opset=opset))
    except Exception as exc:  # the original does not run on zero states: no check, so no preparation
        log.warning("prepare: skipped, the original does not run with zeros for %s: %s", list(zeros), exc)
        return unprepared(model)


def prepared_handle(preparation: Preparation) -> ModelHandle:
    """A handle on the prepared model in the cache, its hash taken from the cache entry."""
    handle = ModelHandle.from_path(preparation.model, field_name="prepared model")
    handle.__dict__["sha256"] = preparation.sha256  # verified by the cache when it was read
    return handle
