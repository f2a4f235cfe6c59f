"""Evaluations in another Python environment (``target.python``), see :mod:`quantune.evaluate.backend`."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from quantune.errors import ConfigError
from quantune.evaluate._exchange import Feeds, MemoryProbe, Scratch, read_outputs, shared_client
from quantune.evaluate.feeds import FeedOutputs
from quantune.evaluate.latency import (
    SETTLE_EVERY,
    SETTLE_FROM,
    WARMUP_SHARE,
    LatencySpec,
    TimingRequest,
    latency_lane,
    timing_end,
)
from quantune.evaluate.rounds import decide_in_chunks
from quantune.evaluate.session import DEFAULT_PROVIDER
from quantune.evaluate.session_file import read_session_settings
from quantune.evaluate.target_client import TargetFault, TargetUnavailable
from quantune.evaluate.target_server import chosen_provider


def _one_at_a_time(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` holding its server for its whole sequence of requests (see ``TargetClient.lock``)."""

    @functools.wraps(method)
    def guarded(self: TargetBackend, *args: Any, **kwargs: Any) -> Any:
        with self.client.lock:
            return method(self, *args, **kwargs)

    return guarded


class TargetBackend:
    """Evaluations in ``python``'s environment through its evaluation server (isolated, limited).

    ``runner``: the evaluation runner as ``/absolute/path.py:function``, imported in the target.
    """

    def __init__(
        self,
        python: str,
        provider: str = DEFAULT_PROVIDER,
        provider_options: Mapping[str, Any] | None = None,
        *,
        timeout_s: float = 600.0,
        memory_limit_mb: int | None = None,
        runner: str | None = None,
    ) -> None:
        self.python = python
        self.provider = provider
        self.provider_options = {
            str(k): str(v) for k, v in (provider_options or {}).items()
        }  # as onnxruntime takes them
        self.runner = runner
        self.scratch = Scratch()
        self.client = shared_client(python, "evaluate", timeout_s=timeout_s, memory_limit_mb=memory_limit_mb)
        memory_client = shared_client(python, "memory", timeout_s=timeout_s, memory_limit_mb=memory_limit_mb)
        self._memory = MemoryProbe(memory_client, self.scratch, provider, self.provider_options, runner)
        self._info: dict[str, Any] | None = None

    def info(self) -> dict[str, Any]:
        if self._info is None:
            self._info = self.client.request("info")
        return self._info

    def check(self) -> None:
        """A :class:`ConfigError` unless the interpreter starts, imports onnxruntime and has the provider."""
        if not Path(self.python).is_file():
            raise ConfigError(f"target.python: '{self.python}' does not exist; give the path of a Python interpreter")
        try:
            self.client.start()
            info = self.info()
        except (TargetUnavailable, TargetFault) as exc:
            raise ConfigError(f"target.python: {exc}") from None
        if self.provider not in info["providers"]:
            raise ConfigError(
                f"target.provider: '{self.provider}' is not available in target.python {self.python} (onnxruntime "
                f"{info['onnxruntime']} has {info['providers']}); install the onnxruntime package that has it there"
            )

    def fingerprint(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "provider_options": self.provider_options,
            "onnxruntime": self.info()["onnxruntime"],
            "target": "python",
        }

    def describe(self) -> dict[str, Any]:
        info = self.info()
        return {
            "python": info["executable"],
            "isolated": True,
            "python_version": info["python"],
            "onnxruntime": info["onnxruntime"],
            "numpy": info["numpy"],
            "provider": self.provider,
            "provider_options": self.provider_options,
            "providers_available": info["providers"],
            "cpu": info["cpu"],
        }

    def _provider_of(self, model: Path, settings: Mapping[str, Any] | None) -> str:
        chosen = read_session_settings(model) if settings is None else settings
        return chosen_provider(self.provider, self.provider_options, chosen)[0]

    def _load(self, model: Path, threads: int, timing: bool, settings: Mapping[str, Any] | None = None) -> int:
        return int(self._open(model, threads, timing, settings)["session"])

    @_one_at_a_time
    def open_s(self, model: Path, threads: int, settings: Mapping[str, Any] | None = None) -> float:
        try:
            return float(self._open(model, threads, True, settings)["open_s"])
        finally:
            self.client.request("free")

    def _open(self, model: Path, threads: int, timing: bool, settings: Mapping[str, Any] | None) -> dict[str, Any]:
        chosen = dict((read_session_settings(model) if settings is None else settings) or {})
        provider, _ = chosen_provider(self.provider, self.provider_options, chosen)
        answer = self.client.request(
            "load",
            model=str(model),
            threads=threads,
            timing=timing,
            settings=chosen,
            provider=self.provider,
            provider_options=self.provider_options,
        )
        used = answer["providers"]
        if not used or used[0] != provider:  # e.g. CUDA requested, no GPU: onnxruntime fell back
            raise TargetFault(f"target.provider: '{provider}' did not take the model; onnxruntime put it on {used}")
        return answer

    @_one_at_a_time
    def outputs(
        self,
        model: Path,
        feeds: Feeds,
        *,
        threads: int,
        runner: Callable | None,
        settings: Mapping[str, Any] | None = None,
        every_output: bool = True,
    ) -> FeedOutputs:
        """``every_output=False`` keeps only the first output of each feed (the target sends all)."""
        path, layout = self.scratch.arrays(feeds)
        out = self.scratch.path(".npz")
        try:
            try:
                session = self._load(model, threads, timing=False, settings=settings)
            except TargetFault as exc:
                if "target crashed" in str(exc) or "target timeout" in str(exc):
                    raise
                where = self._provider_of(model, settings)  # a failure that teaches names where it failed
                raise TargetFault(f"onnxruntime cannot load the model on {where}: {exc}") from None
            answer = self.client.request(
                "run", session=session, feeds=str(path), layout=layout, out=str(out), runner=self.runner
            )
            produced = read_outputs(out, answer["layout"])
            return produced if every_output else [dict([next(iter(feed.items()))]) for feed in produced]
        finally:
            self._free()
            out.unlink(missing_ok=True)

    @_one_at_a_time
    def time(self, request: TimingRequest) -> np.ndarray:
        """The rounds of ``Backend.time`` in the target, in batches on sessions opened and warmed once
        (opened again, OpenVINO would compile every model again); each batch takes the seconds left."""
        opened: dict[tuple[int, Path], int] = {}  # by row and model: a session each, warmed once
        warmed: set[tuple[int, Path]] = set()

        def sessions_for(models: list[Path | None]) -> list[int | None]:
            for key in ((row, model) for row, model in enumerate(models) if model is not None):
                if key not in opened:
                    opened[key] = self._load(key[1], request.spec.threads, True, request.settings)
            return [None if model is None else opened[row, model] for row, model in enumerate(models)]

        def timed(
            models: list[Path | None], spec: LatencySpec, first: int, end: float | None, fewest: int
        ) -> np.ndarray:
            sessions = sessions_for(models)
            cold = {(row, model) for row, model in enumerate(models) if model is not None} - warmed
            warmed.update(cold)
            return self._time(sessions, request.feed, spec if cold else replace(spec, warmup=0), first, end, fewest)

        try:
            if request.threshold is not None:
                return decide_in_chunks(
                    lambda models, spec, first: timed(models, spec, first, request.limit, 5), request
                )
            spec, models = request.spec, list(request.models)
            sessions_for(models)  # before the time share starts, as the sessions here open first
            end = timing_end(spec, len(models), request.deadline)  # the time share, or the caller's deadline
            if request.settled is None or spec.repeats <= SETTLE_FROM:
                return timed(models, spec, 0, end, request.min_rounds)
            done = timed(models, replace(spec, repeats=SETTLE_FROM), 0, end, min(request.min_rounds, SETTLE_FROM))
            while done.shape[1] < spec.repeats and done.shape[1] >= SETTLE_FROM and not request.settled(done):
                if time.perf_counter() >= end and done.shape[1] >= request.min_rounds:
                    break
                more = replace(spec, repeats=min(SETTLE_EVERY, spec.repeats - done.shape[1]))
                done = np.concatenate([done, timed(models, more, done.shape[1], None, 1)], axis=1)
            return done
        finally:
            self._free()

    def _time(
        self,
        sessions: list[int | None],
        feed: dict[str, np.ndarray],
        spec: LatencySpec,
        first: int,
        deadline: float | None,
        fewest: int,
    ) -> np.ndarray:
        """Interleaved rounds of sessions the target holds open (a ``None`` sits out), from round ``first``."""
        path, layout = self.scratch.arrays([feed])
        with latency_lane():
            answer = self.client.request(
                "time",
                sessions=sessions,
                feed=str(path),
                names=layout[0],
                warmup=spec.warmup,
                repeats=spec.repeats,
                first=first,
                runner=self.runner,
                seconds=None if deadline is None else deadline - time.perf_counter(),
                warmup_seconds=WARMUP_SHARE * spec.seconds * sum(s is not None for s in sessions),
                min_rounds=fewest,
            )
        return np.asarray(answer["timings"], dtype=np.float64)

    def _free(self) -> None:
        with contextlib.suppress(TargetFault):
            if self.client.process is not None:
                self.client.request("free")

    def peak_memory_mb(
        self, model: Path, feed: dict[str, np.ndarray], threads: int, settings: Mapping[str, Any] | None = None
    ) -> float:
        return self._memory.measure(
            model, feed, threads, read_session_settings(model) if settings is None else settings
        )

    def close(self) -> None:
        """Stops the servers (the next request starts them again) and removes the scratch files."""
        self.client.stop()
        self._memory.client.stop()
        self.scratch.close()
