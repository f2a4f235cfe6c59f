"""Model preparation: the steps in order, each checked, the result cached.

Each step rewrites the model's form, never its function; a step that fails or changes the
outputs is dropped with a warning, and the outcome is cached so a second run does no work.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantune.model import ModelHandle
from quantune.prepare._files import save_model
from quantune.prepare.check import ATOL, MAX_FLIPS, RTOL, Feeds, outputs_differ, run_feeds
from quantune.prepare.cleanup import basic_cleanup
from quantune.prepare.constants import constants_to_initializers
from quantune.prepare.facts import model_facts
from quantune.prepare.opset import raise_opset
from quantune.prepare.shapes import infer_shapes
from quantune.store import ArtifactCache, cache_key

log = logging.getLogger("quantune.prepare")

# Bump when a step's output for the same input changes, so old prepared models are not reused.
PREPARE_VERSION = 2  # 2: facts hold matmul_weights and op_types (transformer_opt, weight_only prune by them)


@dataclass(frozen=True)
class PrepareOptions:
    opset: int = 0  # the default-domain opset the run's passes need (0: leave it)


StepFunction = Callable[[onnx.ModelProto, PrepareOptions, Path], tuple[onnx.ModelProto, list[str]]]


@dataclass(frozen=True)
class PrepareStep:
    """One step: ``run(model, options, work_dir) -> (model, changes)``; no changes, no new model."""

    name: str
    run: StepFunction


DEFAULT_STEPS: tuple[PrepareStep, ...] = (
    PrepareStep("constants", lambda model, options, work: constants_to_initializers(model)),
    PrepareStep("opset", lambda model, options, work: raise_opset(model, options.opset)),
    PrepareStep("cleanup", lambda model, options, work: basic_cleanup(model, work)),
    PrepareStep("shapes", lambda model, options, work: infer_shapes(model)),
)


@dataclass(frozen=True)
class Preparation:
    """What preparation did: the model trials start from (the original when nothing changed),
    one line per change, one line per step that was dropped, and the model's facts."""

    model: Path
    sha256: str
    steps: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    cache: str = "off"  # hit, miss, or off (prepare: off)

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "warnings": self.warnings, "model": str(self.model), "facts": self.facts}


def unprepared(model: ModelHandle) -> Preparation:
    """The original as it is (``prepare: off``), with its facts for pruning."""
    return Preparation(
        model.path, model.sha256, facts=model_facts(onnx.load(str(model.path), load_external_data=False))
    )


def prepare_model(
    model: ModelHandle,
    feeds: Feeds,
    cache: ArtifactCache,
    options: PrepareOptions = PrepareOptions(),
    steps: Sequence[PrepareStep] = DEFAULT_STEPS,
) -> Preparation:
    """Prepares ``model`` (checked on ``feeds``, a few evaluation batches), through ``cache``."""
    key = cache_key(
        "prepare",
        PREPARE_VERSION,
        model.sha256,
        vars(options),
        [step.name for step in steps],
        feeds_digest(feeds),
        [RTOL, ATOL, MAX_FLIPS],
    )
    record = cache.get_json("prepare", key)
    if record is not None:
        if record["model"] is None:
            return Preparation(model.path, model.sha256, [], record["warnings"], record["facts"], "hit")
        stored = cache.get_model(key)
        if stored is not None:
            return Preparation(stored[0], stored[1], record["steps"], record["warnings"], record["facts"], "hit")
    work = cache.new_work_dir()
    try:
        return _prepare(model, feeds, cache, options, steps, key, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _prepare(
    model: ModelHandle,
    feeds: Feeds,
    cache: ArtifactCache,
    options: PrepareOptions,
    steps: Sequence[PrepareStep],
    key: str,
    work: Path,
) -> Preparation:
    if not feeds:  # nothing to check a step against: an unchecked model is never used
        return Preparation(
            model.path,
            model.sha256,
            [],
            ["not prepared: no evaluation rows to check it on"],
            unprepared(model).facts,
            "miss",
        )
    try:
        reference = run_feeds(model.path, feeds)
    except Exception as exc:  # not cached: the run's own checks say what is wrong with model or data
        warning = f"not prepared: the original model does not run on the evaluation data ({type(exc).__name__})"
        return Preparation(model.path, model.sha256, [], [warning], unprepared(model).facts, "miss")
    final = cache.new_work_dir()
    # All steps, then one check; only when it fails is each step checked on its own.
    try:
        at_once = _all_steps(onnx.load(str(model.path)), options, steps, work, final / "model.onnx", reference, feeds)
        if at_once is None:
            current, changes, warnings = _step_by_step(
                onnx.load(str(model.path)), options, steps, work, reference, feeds
            )
            if changes:
                save_model(current, final / "model.onnx")
        else:
            current, changes, warnings = at_once
    except BaseException:
        shutil.rmtree(final, ignore_errors=True)
        raise
    facts = model_facts(current)
    for line in warnings:
        log.warning("%s", line)
    if not changes:
        shutil.rmtree(final, ignore_errors=True)
        cache.put_json("prepare", key, {"model": None, "steps": [], "warnings": warnings, "facts": facts})
        return Preparation(model.path, model.sha256, [], warnings, facts, "miss")
    path, sha = cache.put_model(key, final, {"prepared_from": model.sha256, "steps": changes})
    cache.put_json("prepare", key, {"model": sha, "steps": changes, "warnings": warnings, "facts": facts})
    return Preparation(path, sha, changes, warnings, facts, "miss")


Outcome = tuple[onnx.ModelProto, list[str], list[str]]  # the model, its changes, the warnings


def _run_step(step: PrepareStep, current: onnx.ModelProto, options: PrepareOptions, work: Path, warnings: list[str]):
    """(model, changes) of one step, or ``None`` (with the warning) when it raised."""
    try:
        return step.run(current, options, work)
    except Exception as exc:
        warnings.append(f"prepare step '{step.name}' failed and is skipped: {type(exc).__name__}: {exc}")
        return None


def _check(model: onnx.ModelProto, path: Path, reference: list[list[np.ndarray]], feeds: Feeds) -> str | None:
    """Why ``model`` (saved at ``path``) does not give the reference outputs, or ``None``."""
    try:
        save_model(model, path)
        return outputs_differ(reference, run_feeds(path, feeds))
    except Exception as exc:
        return f"the model does not run: {type(exc).__name__}: {exc}"


def _all_steps(
    current: onnx.ModelProto,
    options: PrepareOptions,
    steps: Sequence[PrepareStep],
    work: Path,
    path: Path,
    reference: list[list[np.ndarray]],
    feeds: Feeds,
) -> Outcome | None:
    """Every step in turn, the result checked once (and left at ``path``); ``None`` when it
    differs from the original (then each step is checked on its own)."""
    changes: list[str] = []
    warnings: list[str] = []
    for step in steps:
        ran = _run_step(step, current, options, work, warnings)
        if ran is not None and ran[1]:
            current = ran[0]
            changes.extend(ran[1])
    if changes and _check(current, path, reference, feeds):
        return None
    return current, changes, warnings


def _step_by_step(
    current: onnx.ModelProto,
    options: PrepareOptions,
    steps: Sequence[PrepareStep],
    work: Path,
    reference: list[list[np.ndarray]],
    feeds: Feeds,
) -> Outcome:
    """Each step checked on its own: one that changes the outputs is dropped with a warning, and
    the steps after it start from the model before it."""
    changes: list[str] = []
    warnings: list[str] = []
    for step in steps:
        ran = _run_step(step, current, options, work, warnings)
        if ran is None or not ran[1]:
            continue
        candidate, lines = ran
        reason = _check(candidate, work / step.name / "model.onnx", reference, feeds)
        if reason:
            warnings.append(f"prepare step '{step.name}' changed the outputs and is not used ({reason})")
            continue
        current = candidate
        changes.extend(lines)
    return current, changes, warnings


def feeds_digest(feeds: Feeds) -> str:
    """The identity of the checked rows (names, dtypes, shapes, bytes)."""
    digest = hashlib.sha256()
    for feed in feeds:
        for name in sorted(feed):
            array = np.ascontiguousarray(feed[name])
            digest.update(f"{name}\0{array.dtype}\0{array.shape}\0".encode())
            digest.update(array.tobytes())
        digest.update(b"\1")
    return digest.hexdigest()
