"""Session settings searched on the winning model/provider pair, by paired timing.

Once the verdict names a model and the provider it runs on, the settings that change its speed
for a fixed thread count are tried one group at a time, as ``passes/onnx/session_tuning.py``
does for a flow's model: graph optimization level, execution mode, and the provider's own
options (OpenVINO's precision hint). Each value is timed interleaved with the current choice
on the target (``Backend.timings``: every copy of the model carries its settings beside it, so
a target environment times it too) and replaces it only when its median paired ratio's 90%
interval lies below 1 (``evaluate/paired.py``). Threads stay ``evaluation.latency.threads``.
A setting may change the numbers (a precision hint), so the chosen settings are evaluated again
on the whole evaluation data and kept only when they still meet the criterion.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from quantune.evaluate.paired import paired_ratio
from quantune.evaluate.session_file import write_session_settings
from quantune.model import external_data_files
from quantune.passes.onnx.session_tuning import LEVELS, MAX_WARMUP, _copy_model

log = logging.getLogger("quantune.session_search")

ROUNDS = 20
# Provider options that change speed for a fixed thread count, per provider (the first: its default).
PROVIDER_OPTIONS: dict[str, list[dict[str, str]]] = {
    "OpenVINOExecutionProvider": [{}, {"precision": "ACCURACY"}, {"precision": "FP32"}],
}


def option_groups(provider: str) -> list[list[dict[str, Any]]]:
    """The groups tried in turn (the first option of each: onnxruntime's default)."""
    groups: list[list[dict[str, Any]]] = [
        [{"graph_optimization_level": level} for level in LEVELS],
        [{"execution_mode": mode} for mode in ("sequential", "parallel")],
    ]
    if provider in PROVIDER_OPTIONS:
        groups.append([{"provider_options": options} for options in PROVIDER_OPTIONS[provider]])
    return groups


def search_session(
    evaluator: Any, model: Path, settings: dict[str, Any], provider: str, deadline: float | None = None
) -> dict[str, Any]:
    """The settings for ``model`` (its own ``settings`` as the start), and per group what was timed.
    ``deadline`` (``time.perf_counter()``, what ``stop.timeout_s`` leaves): no group starts after it,
    and a group's rounds stop there (after the fewest), so the refinement never outlasts the limit."""
    chosen = dict(settings)
    tried: list[dict[str, Any]] = []
    spec = evaluator.spec.latency
    spec = replace(spec, warmup=min(spec.warmup, MAX_WARMUP), repeats=ROUNDS)
    with tempfile.TemporaryDirectory(prefix="quantune-session-") as folder:
        for options in option_groups(provider):
            # the current settings first (a value equal to them is not timed twice), then each other value
            group, candidates = [{}], [chosen]
            for option in options:
                if (merged := _merged(chosen, option)) not in candidates and not _same(chosen, option):
                    group.append(option)
                    candidates.append(merged)
            if len(candidates) == 1:
                continue
            if deadline is not None and time.perf_counter() >= deadline:
                tried.append({"group": group, "skipped": "no time left within stop.timeout_s"})
                break
            paths = [_copy(model, Path(folder) / f"{len(tried)}-{i}", s) for i, s in enumerate(candidates)]
            try:
                timings = evaluator.backend.timings(
                    paths, evaluator.latency_feed, spec, evaluator.spec.runner, deadline=deadline
                )
            except Exception as exc:  # a setting the provider refuses: the group keeps its default
                log.warning("session search: %s failed (%s)", group, " ".join(str(exc).split())[:200])
                tried.append({"group": group, "error": " ".join(str(exc).split())[:200]})
                chosen = candidates[0]
                continue
            best, best_median, ratios = 0, 1.0, []
            for index, row in enumerate(timings[1:], start=1):
                ratio = paired_ratio(row, timings[0])
                ratios.append({"option": group[index], **ratio.to_dict()})
                if ratio.faster and ratio.median < best_median:
                    best, best_median = index, ratio.median
            tried.append({"group": group, "chosen": group[best], "vs_first": ratios})
            chosen = candidates[best]
    return {"settings": chosen, "tried": tried}


def _same(settings: dict[str, Any], option: dict[str, Any]) -> bool:
    """Whether ``option`` is what ``settings`` already run with (absent keys: onnxruntime's defaults)."""
    defaults = {"graph_optimization_level": "all", "execution_mode": "sequential"}
    if any(key not in defaults for key in option):
        return False
    return all(settings.get(key, defaults.get(key)) == value for key, value in option.items() if key in defaults)


def _merged(settings: dict[str, Any], option: dict[str, Any]) -> dict[str, Any]:
    merged = dict(settings)
    for key, value in option.items():
        if key == "provider_options":  # the provider's own options (its thread count) stay; hints change
            base = {k: v for k, v in dict(merged.get(key) or {}).items() if k not in PROVIDER_OPTIONS_KEYS}
            merged[key] = {**base, **value}
            if not merged[key]:
                merged.pop(key)
        else:
            merged[key] = value
    return merged


PROVIDER_OPTIONS_KEYS = {key for options in PROVIDER_OPTIONS.values() for option in options for key in option}


def _copy(model: Path, folder: Path, settings: dict[str, Any]) -> Path:
    """``model`` (and its external data) in ``folder`` with ``settings`` beside it: hard links where
    the file system allows (a large model is not copied once per setting), else copies."""
    folder.mkdir(parents=True)
    path = folder / model.name
    try:
        os.link(model, path)
        for data in external_data_files(model):
            destination = folder / data.relative_to(model.parent)
            destination.parent.mkdir(parents=True, exist_ok=True)
            os.link(data, destination)
    except OSError:
        shutil.rmtree(folder)
        folder.mkdir(parents=True)
        _copy_model(model, path)
    write_session_settings(path, settings)
    return path


def evaluate_settings(evaluator: Any, model: Path, settings: dict[str, Any], reference: Any) -> dict[str, float]:
    """``model``'s figures with ``settings`` (all of them, on the whole evaluation data)."""
    with tempfile.TemporaryDirectory(prefix="quantune-session-") as folder:
        path = _copy(model, Path(folder) / "chosen", settings)
        figures, _ = evaluator.evaluate(path, reference)
    return figures
