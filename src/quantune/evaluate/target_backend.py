"""Evaluations in another Python environment (``target.python``), see :mod:`quantune.evaluate.backend`."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Mapping, Sequence
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
    Settled,
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
        """The target, asked before anything runs: the interpreter starts, imports onnxruntime,
        and has the provider. A :class:`ConfigError` naming ``target.python`` or ``target.provider``."""
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
        """Seconds the target took to create a session on ``model`` (the open alone, timed there)."""
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
            with contextlib.suppress(TargetFault):
                if self.client.process is not None:
                    self.client.request("free")
            out.unlink(missing_ok=True)

    @_one_at_a_time
    def timings(
        self,
        models: list[Path],
        feed: dict[str, np.ndarray],
        spec: LatencySpec,
        runner: Callable | None,
        settings: Mapping[str, Any] | None = None,
        deadline: float | None = None,
        min_rounds: int = 5,
        settled: Settled | None = None,
    ) -> np.ndarray:
        """Interleaved rounds in the target (see ``time_side_by_side``). ``deadline`` is this process's
        ``time.perf_counter()``: the target gets the seconds left to it when the request leaves, on
        its own clock, and starts no round past them once ``min_rounds`` ran (fewer columns come back).
        With ``settled``, the rounds go in batches (``SETTLE_FROM``, then ``SETTLE_EVERY`` at a time) on
        sessions opened and warmed once, asking the rule between batches."""
        try:
            sessions = [self._load(model, spec.threads, timing=True, settings=settings) for model in models]
            end = timing_end(spec, len(models), deadline)  # the time share, or the caller's deadline
            if settled is None or spec.repeats <= SETTLE_FROM:
                return self._time(sessions, feed, spec, end, min_rounds)
            batch = replace(spec, repeats=SETTLE_FROM)
            done = self._time(sessions, feed, batch, end, min(min_rounds, SETTLE_FROM))
            while done.shape[1] < spec.repeats and done.shape[1] >= SETTLE_FROM and not settled(done):
                if time.perf_counter() >= end and done.shape[1] >= min_rounds:
                    break
                more = replace(spec, warmup=0, repeats=min(SETTLE_EVERY, spec.repeats - done.shape[1]))
                done = np.concatenate([done, self._time(sessions, feed, more, None, 1)], axis=1)
            return done
        finally:
            self._free()

    def _time(
        self, sessions: list[int], feed: dict[str, np.ndarray], spec: LatencySpec, deadline: float | None, fewest: int
    ) -> np.ndarray:
        """Interleaved rounds of sessions the target holds open."""
        path, layout = self.scratch.arrays([feed])
        with latency_lane():
            answer = self.client.request(
                "time",
                sessions=sessions,
                feed=str(path),
                names=layout[0],
                warmup=spec.warmup,
                repeats=spec.repeats,
                runner=self.runner,
                seconds=None if deadline is None else deadline - time.perf_counter(),
                warmup_seconds=WARMUP_SHARE * spec.seconds * len(sessions),
                min_rounds=fewest,
            )
        return np.asarray(answer["timings"], dtype=np.float64)

    def _free(self) -> None:
        with contextlib.suppress(TargetFault):
            if self.client.process is not None:
                self.client.request("free")

    @_one_at_a_time
    def time_until_decided(
        self,
        original: Path,
        candidates: Sequence[Path],
        feed: dict[str, np.ndarray],
        spec: LatencySpec,
        runner: Callable | None,
        *,
        threshold: float,
        min_rounds: int = 5,
        max_rounds: int = 20,
        deadline: float | None = None,
        limit: float | None = None,
        original_rounds: int = 0,
        pairs: Sequence[tuple[int, int]] = (),
        early: bool = False,
        anchor: int | None = None,
    ) -> np.ndarray:
        """The same rounds on the target, a few at a time (:func:`.rounds.decide_in_chunks`); the
        run's ``limit`` travels with each batch, as with :meth:`timings`. Each model's session is
        opened once for all the batches (and warmed once): opened again for each, OpenVINO compiled
        every model up to six times, and the ceilings of a 5 MB detector took 24.8 s for 20 rounds."""
        opened: dict[Path, int] = {}

        def timed(models: list[Path], chunk: LatencySpec) -> np.ndarray:
            fresh = [model for model in models if model not in opened]
            for model in fresh:
                opened[model] = self._load(model, chunk.threads, timing=True)
            warm = chunk if fresh else replace(chunk, warmup=0)
            return self._time([opened[model] for model in models], feed, warm, limit, 5)

        try:
            return decide_in_chunks(
                timed,
                original,
                candidates,
                spec,
                threshold=threshold,
                min_rounds=min_rounds,
                max_rounds=max_rounds,
                deadline=deadline,
                limit=limit,
                original_rounds=original_rounds,
                pairs=pairs,
                early=early,
                anchor=anchor,
            )
        finally:
            self._free()

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
