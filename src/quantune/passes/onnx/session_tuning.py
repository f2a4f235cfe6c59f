"""onnxruntime session settings chosen for the model a flow made, by timing them side by side.

The last step of a flow (Olive's ``OrtSessionParamsTuning``): the same model runs faster or
slower with another graph optimization level, execution mode, thread split or memory
planning. The pass starts from onnxruntime's defaults (level ``all``, sequential, every thread
of the budget ``evaluation.latency.threads`` intra-op, memory pattern and arena on) and tries
one group of settings at a time -- threads and execution mode, then the graph optimization
level, then the memory pattern, then the arena -- timing every value of the group interleaved
with the current choice on the run's timed feed (``evaluate.latency.time_side_by_side``). A
value replaces the current one only when its median paired ratio's 90% interval lies below 1
(``evaluate.paired``): a setting is changed because it was faster beyond the noise, never by
chance. A parameter given a value is fixed (and may be searched like any other).

The output is the input model, unchanged, with the chosen settings beside it in
``<model>.session.json`` (``evaluate.session_file``): evaluations apply them, the cache hashes
them with the model, and ``best/`` delivers them. No pass should follow this one: passes read
their input without its side files.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from quantune.errors import TrialError
from quantune.evaluate.latency import time_side_by_side
from quantune.evaluate.paired import paired_ratio
from quantune.evaluate.session_file import write_session_settings
from quantune.model import external_data_files
from quantune.passes.base import Pass, PassConfig, PassContext
from quantune.passes.registry import register_pass
from quantune.passes.timing import PassTiming

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
    """Execution mode and thread splits within ``budget`` threads, onnxruntime's default first.

    Sequential: ``budget`` intra-op threads, and fewer (powers of two; fewer threads can be
    faster for small ops). Parallel (budget >= 2): ``inter`` concurrent branches of ``intra``
    threads each with ``inter + intra - 1 <= budget`` (the calling thread is one of both pools).
    Options contradicting a fixed parameter are left out."""
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
        chosen: dict[str, Any] = {}
        for group in option_groups(budget, config):
            chosen |= group[0]
            if len(group) > 1:
                chosen |= self._fastest(model_in, group, chosen, config.rounds, timing)
        copy_model(model_in, model_out)
        write_session_settings(model_out, chosen)
        log.info("session_tuning chose %s", chosen)

    @staticmethod
    def _fastest(
        model: Path, group: list[dict[str, Any]], current: dict[str, Any], rounds: int, timing: PassTiming
    ) -> dict[str, Any]:
        """The option of ``group`` faster than its first beyond the noise (the fastest such), else the first."""
        spec = replace(timing.spec, warmup=min(timing.spec.warmup, MAX_WARMUP), repeats=rounds)
        settings = [current | option for option in group]
        try:
            timings = time_side_by_side(
                [model] * len(group), timing.feed, spec, runner=timing.runner, settings=settings
            )
        except Exception as exc:  # a setting onnxruntime refuses for this model: keep the defaults' group
            log.warning("session_tuning: timing %s failed (%s); kept %s", group, exc, group[0])
            return group[0]
        best, best_median = group[0], 1.0
        for option, row in zip(group[1:], timings[1:], strict=True):
            ratio = paired_ratio(row, timings[0])
            log.info(
                "session_tuning: %s vs %s: ratio %.3f (90%% %.3f-%.3f)",
                option,
                group[0],
                ratio.median,
                ratio.low,
                ratio.high,
            )
            if ratio.faster and ratio.median < best_median:
                best, best_median = option, ratio.median
        return best


def copy_model(source: Path, target: Path) -> None:
    """The model file and its external data, unchanged (the settings are the pass's whole output)."""
    shutil.copyfile(source, target)
    for data in external_data_files(source):
        destination = target.parent / data.relative_to(source.parent)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(data, destination)
