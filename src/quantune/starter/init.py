"""``quantune init MODEL.onnx [--data ...] [--metric ...]``: a starter config that fits the model.

Writes ``quantune.yaml`` (plus ``data.py`` and ``metric.py`` templates when the data cannot be
read as it is) so that ``quantune check`` passes when the data fits. It never overwrites a file.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from quantune.errors import QuantuneError
from quantune.evaluate.metrics import AGREEMENT_METRICS, LABEL_METRICS, metric_direction
from quantune.starter.data_source import DataSource, classify
from quantune.starter.loader_template import render_loader
from quantune.starter.metric_template import render_metric
from quantune.starter.model_info import ModelInfo, read_model

BUILTIN_METRICS = [*LABEL_METRICS, *AGREEMENT_METRICS]


@dataclass
class InitResult:
    config: Path
    written: list[Path]
    info: ModelInfo
    source: DataSource
    metric: str
    notes: list[str] = field(default_factory=list)

    def next_commands(self) -> list[str]:
        name = os.path.relpath(self.config) if not self.config.is_absolute() else str(self.config)
        return [f"quantune check {name}", f"quantune run {name} --set stop.max_trials=8"]


def init_project(
    model: str | Path, data: list[str] | None = None, metric: str | None = None, output: str | Path = "quantune.yaml"
) -> InitResult:
    """Writes the starter files beside ``output`` and returns what was written and why."""
    config_path = Path(output)
    folder = config_path.parent if str(config_path.parent) else Path(".")
    info = read_model(Path(model))
    if not info.inputs:
        raise QuantuneError(f"init: '{model}' declares no inputs (every graph input is an initializer)")
    source = classify(list(data or []), info)
    chosen = _metric(metric, source, info)
    targets = [config_path]
    if not source.direct:
        targets.append(folder / "data.py")
    if not source.direct or chosen == "metric.py:score":
        targets.append(folder / "metric.py")
    for target in targets:
        if target.exists():
            raise QuantuneError(
                f"init: '{target}' exists; quantune init never overwrites a file (move it, or give --output "
                "a config path in another folder)"
            )
    folder.mkdir(parents=True, exist_ok=True)
    texts = {config_path: render_config(info, source, chosen, folder)}
    if folder / "data.py" in targets:
        texts[folder / "data.py"] = render_loader(info, source, folder)
    if folder / "metric.py" in targets:
        texts[folder / "metric.py"] = render_metric(info)
    for target, text in texts.items():
        with open(target, "x", encoding="utf-8") as handle:  # "x": never over a file made meanwhile
            handle.write(text)
    notes = []
    if source.kind == "synthetic":
        notes.append("no --data given: data.py draws random inputs; replace them with your own data")
    if source.kind == "images":
        notes.append("data.py scales images to [0, 1]: edit preprocess() to your model's own normalisation")
        if importlib.util.find_spec("PIL") is None:
            notes.append("data.py reads images with Pillow, which is not installed: pip install 'quantune[images]'")
    first = info.outputs[0] if info.outputs else None
    if (
        first is not None
        and chosen in BUILTIN_METRICS
        and not first.dtype.startswith("float")
        and len(info.outputs) > 1
    ):
        notes.append(
            f"built-in metrics read the first output, '{first.name}' ({first.dtype}); if another output matters, "
            "score it in metric.py and set evaluation.metric: metric.py:score"
        )
    if source.kind == "npz" and source.calibration == source.evaluation:
        notes.append("one .npz calibrates and evaluates: give a separate calibration file when you have one")
    return InitResult(config_path, list(texts), info, source, chosen, notes)


def _metric(metric: str | None, source: DataSource, info: ModelInfo) -> str:
    if metric is not None:
        if metric in ("custom", "metric.py"):
            return "metric.py:score"
        if metric in BUILTIN_METRICS or ".py:" in metric:
            if metric in LABEL_METRICS and not source.labels:
                raise QuantuneError(
                    f"init --metric {metric}: the data has no labels (a 'label' array, or class sub-folders); "
                    f"use an agreement metric: {', '.join(AGREEMENT_METRICS)}"
                )
            return metric
        raise QuantuneError(
            f"init --metric {metric}: not a metric; use one of {', '.join(BUILTIN_METRICS)}, 'custom' (writes "
            "metric.py) or path/to/script.py:function"
        )
    first = info.outputs[0] if info.outputs else None
    classifier = (
        first is not None
        and first.dtype.startswith("float")
        and first.dims is not None
        and len(first.dims) >= 2
        and first.dims[-1] != 1
    )
    return "top1" if source.labels and classifier else "cosine"


def render_config(info: ModelInfo, source: DataSource, metric: str, folder: Path) -> str:
    """The commented starter config; checked against the schema before it is written."""
    from quantune.config.schema import Config

    model = os.path.relpath(info.path.resolve(), folder.resolve())
    batch = {spec.batch_fixed for spec in info.inputs}
    fixed = batch.pop() if len(batch) == 1 else None
    lines = [
        f"# quantune starter config for {info.path.name}, written by `quantune init`: edit freely.",
        f"# The model (opset {info.opset}): {info.compute_summary()}",
        *[f"#   input  {spec.describe()}" for spec in info.inputs],
        *[f"#   output {spec.describe()}" for spec in info.outputs[:6]],
        *(["#   ..."] if len(info.outputs) > 6 else []),
        "# Next: quantune check <this file>, then quantune run <this file> (--set stop.max_trials=8 for a first look).",
        f"model: {_q(model)}",
        "data:",
        *_data_lines(source, folder),
        _c(f"  batch_size: {fixed or 16}", "the model's batch axis is fixed" if fixed else "rows per batch"),
        "evaluation:",
        _c(f"  metric: {_q(metric)}", _metric_comment(metric, source)),
        _c("  latency: {warmup: 10, repeats: 50, threads: 1}", "threads: as the model will run in production"),
        "criterion:",
        *(
            [
                "  type: relative",
                _c("  tolerable_loss: 0.01", "a candidate may lose at most 1% of the original's figure"),
            ]
            if metric_direction(metric)
            else [  # a difference from the original: 0 for the original itself, so no fraction of it
                "  type: absolute",
                _c("  tolerable_loss: 0.01", f"the most {metric} a candidate may differ by, in its own units"),
            ]
        ),
        _c("objective: latency", "latency | size"),
        "passes:",
        *_pass_lines(info),
        "search:",
        _c("  strategy: quantune", "speed first, then op-type and per-op fallback to fp32 until"),
        _c("  seed: 0", "the budget holds (docs: concepts/strategies.md)"),
        "stop:",
        "  max_trials: 20",
        _c("  timeout_s: 900", "seconds for the whole run"),
        "",
    ]
    text = "\n".join(lines)
    Config.model_validate(yaml.safe_load(text))  # a bug here must never reach the user's file
    return text


def _c(code: str, comment: str) -> str:
    """A config line with its comment in the comment column."""
    return f"{code.ljust(37)}# {comment}" if len(code) < 37 else f"{code}  # {comment}"


def _q(value: str) -> str:
    """A YAML scalar that reads back as the same string."""
    return value if yaml.safe_load(value) == value and ":" not in value.replace(".py:", "") else repr(value)


def _data_lines(source: DataSource, folder: Path) -> list[str]:
    if source.direct:
        assert source.calibration is not None and source.evaluation is not None
        calib = os.path.relpath(source.calibration.resolve(), folder.resolve())
        evaluation = os.path.relpath(source.evaluation.resolve(), folder.resolve())
        label = " + label" if source.labels else ""
        return [
            _c(f"  calibration: {_q(calib)}", "arrays named after the model's inputs"),
            _c(f"  evaluation: {_q(evaluation)}", f"the same arrays{label}"),
        ]
    if source.kind == "synthetic":
        return [
            _c("  calibration: data.py:calibration", "random inputs (no --data given): EDIT data.py"),
            _c("  evaluation: data.py:evaluation", "random inputs of another seed"),
        ]
    what = {"images": "images", "samples": ".npy samples", "arrays": "rows"}[source.kind]
    return [
        _c("  calibration: data.py:calibration", f"every 4th of the {what} (see data.py)"),
        _c("  evaluation: data.py:evaluation", "the others" + (", with labels" if source.labels else "")),
    ]


def _metric_comment(metric: str, source: DataSource) -> str:
    if metric in LABEL_METRICS:
        return "accuracy against the data's labels"
    if metric in AGREEMENT_METRICS:
        why = "no labels given; " if not source.labels else ""
        return f"{why}agreement with the original (or metric.py:score)"
    return "your metric: score(outputs, data) -> float"


def _pass_lines(info: ModelInfo) -> list[str]:
    """Both quantizers in the order that suits the op mix, and a fine-tune after static int8 (the
    recover stage tries it before any fallback). Bias correction is left out: it is too slow."""
    static = _c("  - {name: static_quant, search: true}", "int8 with calibration: the usual win on conv nets")
    dynamic = _c("  - {name: dynamic_quant, search: true}", "int8 weights, activations on the fly: MatMul/LSTM")
    refine = _c("  - {name: fast_finetune}", "AdaRound of the worst layers, tried on a close miss")
    refined = "[static_quant, fast_finetune]"
    kinds = info.kinds
    if "recurrent" in kinds or ("MatMul-heavy" in kinds and "conv-heavy" not in kinds):
        return [dynamic, static, refine, f"flows: [[dynamic_quant], [static_quant], {refined}]"]
    return [static, dynamic, refine, f"flows: [[static_quant], [dynamic_quant], {refined}]"]
