"""onnxruntime session settings chosen for the model a flow made, by timing them side by side.

One group of settings at a time from onnxruntime's defaults (:func:`search_groups`); a parameter given a value is fixed.
The output is the input model with the settings beside it (``evaluate.session_file``), so no pass should follow this
one."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from quantune.errors import TrialError
from quantune.evaluate.latency import TimingRequest, time_side_by_side
from quantune.evaluate.paired import paired_ratio
from quantune.evaluate.session_file import write_session_settings
from quantune.model import external_data_files
from quantune.passes.base import Pass, PassConfig, PassContext
from quantune.passes.registry import register_pass

log = logging.getLogger("quantune.passes.session_tuning")

Level = Literal["disable_all", "basic", "extended", "all"]
LEVELS: tuple[str, ...] = ("all", "extended", "basic", "disable_all")
# Warm-up runs per session before the interleaved rounds (capped: each group opens several sessions).
MAX_WARMUP = 5


class SessionTuningConfig(PassConfig):
    """``None``: chosen by timing; a value: fixed."""

    graph_optimization_level: Level | None = None
    execution_mode: Literal["sequential", "parallel"] | None = None
    intra_op_num_threads: int | None = Field(default=None, gt=0, le=1024)
    inter_op_num_threads: int | None = Field(default=None, gt=0, le=1024)
    enable_mem_pattern: bool | None = None
    enable_cpu_mem_arena: bool | None = None
    rounds: int = Field(default=20, ge=5, le=1000, description="Interleaved timing rounds per group of settings.")


def thread_options(budget: int, config: SessionTuningConfig) -> list[dict[str, Any]]:
    """Execution mode and thread splits within ``budget`` threads (the default first), fixed parameters held."""
    options: list[dict[str, Any]] = [{"execution_mode": "sequential", "intra_op_num_threads": budget}]
    fewer = 1
    while fewer < budget:
        options.append({"execution_mode": "sequential", "intra_op_num_threads": fewer})
        fewer *= 2
    for inter in sorted({2, budget} - {1}):
        if inter <= budget:
            intra = max(1, budget - inter + 1)
            options.append({"execution_mode": "parallel", "inter_op_num_threads": inter, "intra_op_num_threads": intra})
    fixed = {
        key: value
        for key in ("execution_mode", "intra_op_num_threads", "inter_op_num_threads")
        if (value := getattr(config, key)) is not None
    }
    kept = [option for option in options if all(option.get(key, value) == value for key, value in fixed.items())]
    if not kept:  # the fixed values are not among ours: they are the one option
        kept = [{"execution_mode": "sequential", "intra_op_num_threads": budget} | fixed]
    return [_full_threads(option) for option in kept]


def _full_threads(option: dict[str, Any]) -> dict[str, Any]:
    """Every thread key set, so the stored settings reproduce the timed session exactly."""
    return {"inter_op_num_threads": 1, **option}


def option_groups(budget: int, config: SessionTuningConfig) -> list[list[dict[str, Any]]]:
    """The groups tried in turn, each a list of partial settings (the first: onnxruntime's default)."""
    groups = [thread_options(budget, config)]
    for key, values in (
        ("graph_optimization_level", LEVELS),
        ("enable_mem_pattern", (True, False)),
        ("enable_cpu_mem_arena", (True, False)),
    ):
        fixed = getattr(config, key)
        groups.append([{key: value} for value in ((fixed,) if fixed is not None else values)])
    return groups


@register_pass
class SessionTuning(Pass):
    """Chooses onnxruntime session settings for its input model by side-by-side timing."""

    name = "session_tuning"
    role = "tune"
    Config = SessionTuningConfig
    search_space = {}
    needs_timing = True
    last_in_flow = True

    def run(self, config: SessionTuningConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        timing = context.timing
        if timing is None:
            raise TrialError("session_tuning times the model on the evaluation's latency feed; none was given")
        budget = timing.spec.threads
        for key in ("intra_op_num_threads", "inter_op_num_threads"):
            value = getattr(config, key)
            if value is not None and value > budget:
                raise TrialError(
                    f"session_tuning.{key}: {value} exceeds the thread budget evaluation.latency.threads ({budget})"
                )
        groups = option_groups(budget, config)
        start = {key: value for group in groups for key, value in group[0].items()}  # every key set
        spec = replace(timing.spec, warmup=min(timing.spec.warmup, MAX_WARMUP), repeats=config.rounds)
        request = TimingRequest((), timing.feed, spec, timing.runner)
        with tempfile.TemporaryDirectory(prefix="quantune-session-", dir=context.work_dir.parent) as folder:
            chosen, _ = search_groups(model_in, groups, start, request, time_here, Path(folder))
        copy_model(model_in, model_out)
        write_session_settings(model_out, chosen)
        log.info("session_tuning chose %s", chosen)


def time_here(request: TimingRequest) -> np.ndarray:
    """``request`` timed in this process on onnxruntime's default provider, each model with its own settings."""
    return time_side_by_side(
        list(request.models), request.feed, request.spec, runner=request.runner, deadline=request.deadline
    )


def search_groups(
    model: Path,
    groups: Sequence[Sequence[dict[str, Any]]],
    start: dict[str, Any],
    request: TimingRequest,
    time_request: Callable[[TimingRequest], np.ndarray],
    folder: Path,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The settings for ``model`` searched one group at a time from ``start``, and per group what was timed: copies of
    ``model`` with each value beside them, timed interleaved; a value wins only when its ratio's interval lies below 1.
    No group starts past ``request.deadline``."""
    chosen, tried = dict(start), []
    for options in groups:
        # the current settings first (a value equal to them is not timed twice), then each other value
        group, candidates = [{}], [chosen]
        keys = {key for option in options for key in option.get("provider_options", {})}
        for option in options:
            if (merged := merge_settings(chosen, option, keys)) not in candidates and not _same(chosen, option):
                group.append(option)
                candidates.append(merged)
        if len(candidates) == 1:
            continue
        if request.deadline is not None and time.perf_counter() >= request.deadline:
            tried.append({"group": group, "skipped": "no time left within stop.timeout_s"})
            break
        paths = [settings_copy(model, folder / f"{len(tried)}-{i}", s) for i, s in enumerate(candidates)]
        try:
            timings = time_request(replace(request, models=tuple(paths)))
        except Exception as exc:  # a setting onnxruntime or the provider refuses: the group keeps the current
            error = " ".join(str(exc).split())[:200]
            log.warning("session settings: timing %s failed (%s); kept %s", group, error, chosen)
            tried.append({"group": group, "error": error})
            continue
        best, best_median, ratios = 0, 1.0, []
        for index, row in enumerate(timings[1:], start=1):
            ratio = paired_ratio(row, timings[0])
            ratios.append({"option": group[index], **ratio.to_dict()})
            if ratio.faster and ratio.median < best_median:
                best, best_median = index, ratio.median
        log.info("session settings: %s chosen of %s (ratios %s)", group[best], group, ratios)
        tried.append({"group": group, "chosen": group[best], "vs_first": ratios})
        chosen = candidates[best]
    return chosen, tried


def _same(settings: dict[str, Any], option: dict[str, Any]) -> bool:
    """Whether ``option`` is what ``settings`` already run with (absent keys: onnxruntime's defaults)."""
    defaults = {"graph_optimization_level": "all", "execution_mode": "sequential"}
    if any(key not in defaults for key in option):
        return False
    return all(settings.get(key, defaults.get(key)) == value for key, value in option.items() if key in defaults)


def merge_settings(settings: dict[str, Any], option: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    """``settings`` with ``option``; a provider option of the group replaces its value, the others stay."""
    merged = dict(settings)
    for key, value in option.items():
        if key == "provider_options":
            base = {k: v for k, v in dict(merged.get(key) or {}).items() if k not in keys}
            merged[key] = {**base, **value}
            if not merged[key]:
                merged.pop(key)
        else:
            merged[key] = value
    return merged


def settings_copy(model: Path, folder: Path, settings: dict[str, Any]) -> Path:
    """``model`` and its external data in ``folder`` with ``settings`` beside it: hard links where possible."""
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
        copy_model(model, path)
    write_session_settings(path, settings)
    return path


def copy_model(source: Path, target: Path) -> None:
    """The model file and its external data, unchanged (the settings are the pass's whole output)."""
    shutil.copyfile(source, target)
    for data in external_data_files(source):
        destination = target.parent / data.relative_to(source.parent)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(data, destination)
