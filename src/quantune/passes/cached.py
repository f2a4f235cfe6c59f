"""Passes run through the content-addressed cache: the one way trials and the sensitivity probe
run them, so each finds the other's outputs under the same keys."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from quantune.data import Dataset
from quantune.errors import DiskFull, TrialError
from quantune.model import external_data_files, file_sha256
from quantune.passes.base import Pass, PassConfig, PassContext
from quantune.passes.timing import PassTiming
from quantune.store import ArtifactCache, cache_key
from quantune.store.faults import LOW_SPACE_BYTES, free_bytes, is_disk_full

log = logging.getLogger("quantune.runner")

_ONLY_CACHED: ContextVar[bool] = ContextVar("quantune_only_cached", default=False)


class NotCached(Exception):
    """A pass output asked for under ``only_cached()`` that the cache does not hold."""


@contextlib.contextmanager
def only_cached() -> Iterator[None]:
    """Passes answer from the cache or raise :class:`NotCached` (where no pass may run)."""
    token = _ONLY_CACHED.set(True)
    try:
        yield
    finally:
        _ONLY_CACHED.reset(token)


def run_pass_cached(
    cache: ArtifactCache,
    pass_cls: type[Pass],
    config: PassConfig,
    model: Path,
    model_sha: str,
    *,
    calibration: Dataset | None,
    input_names: list[str],
    batch_size: int,
    label: str,
    external_data: list[Path] | None = None,
    timing: PassTiming | None = None,
    check_input: Callable[[], None] | None = None,
) -> tuple[Path, str, bool]:
    """(output model, its sha256, whether it came from the cache); a failed pass leaves nothing
    behind. ``check_input`` raises when ``model`` no longer holds ``model_sha``: asked once the pass
    ran, so an output built from other content is never cached under this key."""
    parts: list[Any] = ["pass", pass_cls.name, pass_cls.version, model_sha, config.model_dump(mode="json")]
    parts += user_code(pass_cls)
    if pass_cls.needs_calibration:
        parts += [calibration.fingerprint if calibration else None, batch_size]
    if pass_cls.needs_timing:
        parts += ["timing", timing.fingerprint if timing else None]
    key = cache_key(*parts)
    cached = cache.get_model(key)
    if cached is not None:
        return (*cached, True)
    if _ONLY_CACHED.get():
        raise NotCached(label)
    work_dir = cache.new_work_dir()
    view_dir = cache.new_work_dir()
    output = work_dir / "model.onnx"
    context = PassContext(
        calibration,
        input_names,
        batch_size,
        work_dir,
        model_sha256=model_sha,
        cache_dir=cache.root / "passes" / pass_cls.name,
        timing=timing,
    )
    printed = io.StringIO()  # onnxruntime's calibrators print progress; keep it in the log
    try:
        with contextlib.redirect_stdout(printed):
            pass_cls().run(config, private_view(model, view_dir, external_data), output, context)
        if not output.is_file():
            raise TrialError(f"pass '{label}' wrote no model")
    except Exception as exc:
        # onnxruntime misses short writes of its model copies: less room than three copies counts as full
        free = free_bytes(work_dir)
        size = sum(p.stat().st_size for p in [model, *(external_data or [])] if p.is_file())
        full = is_disk_full(exc) or (free is not None and free < max(LOW_SPACE_BYTES, 3 * size))
        shutil.rmtree(work_dir, ignore_errors=True)
        if full:  # onnxruntime's writers stop short silently: "Wire format was corrupt" meant this
            raise DiskFull(cache.root) from None
        if isinstance(exc, TrialError):
            raise
        raise TrialError(f"pass '{label}' failed: {type(exc).__name__}: {exc}") from exc
    finally:
        shutil.rmtree(view_dir, ignore_errors=True)
        if printed.getvalue():
            log.info("pass %s printed:\n%s", label, printed.getvalue().rstrip())
    if check_input is not None:
        try:
            check_input()
        except BaseException:
            shutil.rmtree(work_dir, ignore_errors=True)
            raise
    path, sha = cache.put_model(key, work_dir, {"pass": pass_cls.name, "config": config.model_dump()})
    return path, sha, False


def user_code(pass_cls: type[Pass]) -> list[str]:
    """The sha256 of a plugin pass's file, so an edited one never reuses old outputs."""
    if pass_cls.__module__.split(".")[0] == "quantune":
        return []
    module = sys.modules.get(pass_cls.__module__)
    sha = getattr(module, "__quantune_sha256__", None)  # set when quantune imported the script
    if sha is None:
        path = getattr(module, "__file__", None)
        sha = file_sha256(path) if path and os.path.isfile(path) else None
    return [sha] if sha else []


def private_view(model_path: Path, folder: Path, external_data: list[Path] | None = None) -> Path:
    """``model_path`` as seen from ``folder``, so the side files onnxruntime's quantizers write
    beside the model they read land there, not in the user's folder or racing other workers.

    A symlink, or for a model with external data a copy with its data files (onnx refuses
    external data reached through a link).
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


def run_flow_cached(
    cache: ArtifactCache,
    steps: Iterable[tuple[str, type[Pass], PassConfig]],
    model: Path,
    model_sha: str,
    *,
    calibration: Dataset | None,
    input_names: list[str],
    batch_size: int,
    external_data: list[Path] | None = None,
    label_suffix: str = "",
    on_step: Callable[[str, bool, float], None] | None = None,
    timing: PassTiming | None = None,
    check_input: Callable[[], None] | None = None,
) -> tuple[Path, str]:
    """A flow of (step id, pass class, config) run through the cache: the last output and its sha256.
    ``on_step(step id, cache hit, seconds)`` is told about each step; ``external_data`` and
    ``check_input`` concern ``model`` (the first input) only."""
    current, current_sha = model, model_sha
    for step_id, pass_cls, config in steps:
        started = time.perf_counter()
        current, current_sha, hit = run_pass_cached(
            cache,
            pass_cls,
            config,
            current,
            current_sha,
            calibration=calibration,
            input_names=input_names,
            batch_size=batch_size,
            label=f"{step_id}{label_suffix}",
            external_data=external_data if current == model else None,
            check_input=check_input if current == model else None,
            timing=timing if pass_cls.needs_timing else None,
        )
        if on_step is not None:
            on_step(step_id, hit, time.perf_counter() - started)
    return current, current_sha
