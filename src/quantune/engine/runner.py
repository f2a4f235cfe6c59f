"""Runs one trial: each pass through the cache, then the evaluation through the cache.

A :class:`TrialRunner` holds what every trial of a run shares (model, data, evaluator,
cache) and is built once per worker process; executors only decide where ``run`` is called.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantune.data import Dataset
from quantune.engine.plan import Plan
from quantune.engine.trial import Trial, TrialRecord
from quantune.errors import QuantuneError, TrialError
from quantune.evaluate import Evaluator
from quantune.model import ModelHandle, external_data_files
from quantune.passes import PassContext
from quantune.store import ArtifactCache, cache_key

log = logging.getLogger("quantune.runner")


@dataclass
class RunContext:
    """Everything shared by the trials of one run."""

    model: ModelHandle
    plan: Plan
    calibration: Dataset | None
    evaluator: Evaluator
    cache: ArtifactCache
    batch_size: int

    def eval_key(self, model_sha: str) -> str:
        spec = self.evaluator.spec
        return cache_key("eval", model_sha, spec.fingerprint(), self.evaluator.dataset.fingerprint, self.model.sha256)


class TrialRunner:
    def __init__(self, context: RunContext) -> None:
        self.context = context
        self._reference: dict[str, Any] | None = None

    def baseline(self) -> tuple[dict[str, float], str]:
        """The original model's figures (cached), and whether they came from the cache."""
        ctx = self.context
        key = ctx.eval_key(ctx.model.sha256)
        reference_key = cache_key("reference", key)
        cached = ctx.cache.get_json("evals", key)
        reference = ctx.cache.get_arrays(reference_key)
        if cached is not None and reference is not None:
            self._reference = reference
            return cached["metrics"], "hit"
        try:
            metrics, outputs = ctx.evaluator.evaluate(ctx.model.path, None)
        except TrialError as exc:  # nothing can be compared to a reference that does not evaluate
            raise QuantuneError(f"evaluating the original model failed: {exc}") from None
        ctx.cache.put_arrays(reference_key, outputs)
        ctx.cache.put_json("evals", key, {"metrics": metrics})
        self._reference = outputs
        return metrics, "miss"

    def run(self, trial: Trial) -> TrialRecord:
        record = TrialRecord(number=trial.number, flow=list(trial.flow), params=dict(trial.params), status="ok")
        started = time.perf_counter()
        try:
            model_path, model_sha = self._run_passes(trial, record)
            record.model_path = str(model_path)
            record.metrics = self._evaluate(model_path, model_sha, record)
        except Exception as exc:  # a trial's failure is data, not a crash of the run
            record.status = "failed"
            record.error = f"{type(exc).__name__}: {exc}"
            log.warning("trial %d failed: %s\n%s", trial.number, record.error, traceback.format_exc())
        record.durations["total_s"] = time.perf_counter() - started
        return record

    def _run_passes(self, trial: Trial, record: TrialRecord) -> tuple[Path, str]:
        ctx = self.context
        current, current_sha = ctx.model.path, ctx.model.sha256
        pass_times: dict[str, float] = {}
        for step, config in ctx.plan.configs_for(trial.params, trial.flow):
            pass_cls = step.pass_cls
            parts: list[Any] = [
                "pass",
                pass_cls.name,
                pass_cls.version,
                current_sha,
                config.model_dump(mode="json"),
            ]
            if pass_cls.needs_calibration:
                parts += [ctx.calibration.fingerprint if ctx.calibration else None, ctx.batch_size]
            key = cache_key(*parts)
            cached = ctx.cache.get_model(key)
            started = time.perf_counter()
            if cached is not None:
                current, current_sha = cached
                record.cache[step.id] = "hit"
            else:
                work_dir = ctx.cache.new_work_dir()
                view_dir = ctx.cache.new_work_dir()
                known_data = ctx.model.external_data if current == ctx.model.path else None
                output = work_dir / "model.onnx"
                pass_context = PassContext(
                    ctx.calibration,
                    ctx.evaluator.input_names,
                    ctx.batch_size,
                    work_dir,
                    model_sha256=current_sha,
                    cache_dir=ctx.cache.root / "passes" / pass_cls.name,
                )
                printed = io.StringIO()  # onnxruntime's calibrators print progress; keep it in the log
                try:
                    with contextlib.redirect_stdout(printed):
                        pass_cls().run(config, private_view(current, view_dir, known_data), output, pass_context)
                    if not output.is_file():
                        raise TrialError(f"pass '{step.id}' wrote no model")
                except Exception as exc:
                    shutil.rmtree(work_dir, ignore_errors=True)
                    if isinstance(exc, TrialError):
                        raise
                    raise TrialError(f"pass '{step.id}' failed: {type(exc).__name__}: {exc}") from exc
                finally:
                    shutil.rmtree(view_dir, ignore_errors=True)
                    if printed.getvalue():
                        log.info("pass %s printed:\n%s", step.id, printed.getvalue().rstrip())
                meta = {"pass": pass_cls.name, "config": config.model_dump()}
                current, current_sha = ctx.cache.put_model(key, work_dir, meta)
                record.cache[step.id] = "miss"
            pass_times[step.id] = time.perf_counter() - started
        record.durations["passes_s"] = pass_times
        return current, current_sha

    def _evaluate(self, model_path: Path, model_sha: str, record: TrialRecord) -> dict[str, float]:
        ctx = self.context
        key = ctx.eval_key(model_sha)
        started = time.perf_counter()
        cached = ctx.cache.get_json("evals", key)
        if cached is not None:
            record.cache["evaluation"] = "hit"
            metrics = cached["metrics"]
        else:
            if self._reference is None:
                self.baseline()
            metrics, _ = ctx.evaluator.evaluate(model_path, self._reference)
            ctx.cache.put_json("evals", key, {"metrics": metrics})
            record.cache["evaluation"] = "miss"
        record.durations["evaluation_s"] = time.perf_counter() - started
        return metrics


def private_view(model_path: Path, folder: Path, external_data: list[Path] | None = None) -> Path:
    """``model_path`` as seen from ``folder``, so a pass's side files land in ``folder``.

    onnxruntime's quantizers write side files next to the model they read (``quantize_dynamic``
    writes ``<name>-inferred.onnx`` there and deletes it again). Beside a cached model that is
    a race between workers running passes on the same input (one deletes the file the other
    is reading), and beside the user's model it writes into the user's folder.

    A single-file model is seen through a symlink (free). A model with external data is
    copied with its data files: onnx refuses external data reached through a symlink or a
    hard link (it resolves outside the folder, or looks like a hard-link attack), and the side
    file onnxruntime writes must sit beside the data it refers to.
    """
    source = Path(os.path.abspath(model_path))  # absolute, symlinks kept as the user made them
    data = external_data_files(source) if external_data is None else external_data
    if not data:
        os.symlink(source, folder / source.name)
        return folder / source.name
    for file in [source, *data]:
        target = folder / file.relative_to(source.parent)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, target)
    return folder / source.name
