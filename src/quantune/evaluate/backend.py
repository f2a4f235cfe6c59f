"""Where evaluations run: this process's onnxruntime (:class:`LocalBackend`), or a target
environment's evaluation server (:mod:`quantune.evaluate.target_backend`), so every model is
scored and timed with the target's onnxruntime build and provider while passes run here. Both
measure peak memory in a fresh child process, so the figure never includes what the measuring
process holds. A backend's :meth:`fingerprint` is part of every evaluation cache key.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from quantune import progress
from quantune.errors import ConfigError, TrialError
from quantune.evaluate import rounds
from quantune.evaluate._exchange import Feeds, MemoryProbe, Scratch, shared_client
from quantune.evaluate.budget import batch_follows_rows, run_in_pieces
from quantune.evaluate.feeds import FeedOutputs
from quantune.evaluate.latency import TimingRequest, time_side_by_side
from quantune.evaluate.session import DEFAULT_PROVIDER, open_session
from quantune.evaluate.session_file import read_session_settings
from quantune.evaluate.target_server import chosen_provider, cpu_name


class Backend(Protocol):
    """Where models run; ``settings``: a candidate's session settings, applied alike here and on a target."""

    provider: str

    def fingerprint(self) -> dict[str, Any]: ...
    def describe(self) -> dict[str, Any]: ...
    def check(self) -> None: ...
    def outputs(
        self,
        model: Path,
        feeds: Feeds,
        *,
        threads: int,
        runner: Callable | None,
        settings: Mapping[str, Any] | None = None,
        every_output: bool = True,
    ) -> FeedOutputs: ...
    def time(self, request: TimingRequest) -> np.ndarray: ...
    def peak_memory_mb(
        self, model: Path, feed: dict[str, np.ndarray], threads: int, settings: Mapping[str, Any] | None = None
    ) -> float: ...
    def open_s(self, model: Path, threads: int, settings: Mapping[str, Any] | None = None) -> float: ...


class LocalBackend:
    """This process's onnxruntime on ``provider``; memory in a fresh process of this interpreter."""

    def __init__(
        self,
        provider: str = DEFAULT_PROVIDER,
        provider_options: Mapping[str, Any] | None = None,
        *,
        timeout_s: float = 600.0,
        runner: str | None = None,
    ) -> None:
        self.provider = provider
        self.provider_options = {
            str(k): str(v) for k, v in (provider_options or {}).items()
        }  # as onnxruntime takes them
        self.scratch = Scratch()
        client = shared_client(sys.executable, "memory", timeout_s=timeout_s, memory_limit_mb=None)
        self._memory = MemoryProbe(client, self.scratch, provider, self.provider_options, runner)

    def fingerprint(self) -> dict[str, Any]:
        return {"provider": self.provider, "provider_options": self.provider_options, "onnxruntime": ort.__version__}

    def launch_memory_probe(self) -> None:
        """Starts the memory probe's server now, its imports beside the first evaluation."""
        if os.name == "posix":
            self._memory.client.launch()

    def describe(self) -> dict[str, Any]:
        return {
            "python": sys.executable,
            "isolated": False,
            "onnxruntime": ort.__version__,
            "provider": self.provider,
            "provider_options": self.provider_options,
            "providers_available": list(ort.get_available_providers()),
            "cpu": cpu_name(),
            "platform": platform.platform(),
        }

    def check(self) -> None:
        available = ort.get_available_providers()
        if self.provider not in available:
            raise ConfigError(
                f"target.provider: '{self.provider}' is not available in this environment (onnxruntime "
                f"{ort.__version__} has {available}); install the onnxruntime package that has it, or set "
                "target.python to an interpreter whose environment does"
            )

    def _session(
        self, model: Path, threads: int, timing: bool = False, settings: Mapping[str, Any] | None = None
    ) -> ort.InferenceSession:
        return open_session(
            model,
            threads=threads,
            timing=timing,
            settings=read_session_settings(model) if settings is None else settings,
            provider=self.provider,
            provider_options=self.provider_options,
        )

    def open_s(self, model: Path, threads: int, settings: Mapping[str, Any] | None = None) -> float:
        started = time.perf_counter()
        self._session(model, threads, timing=True, settings=settings)
        return time.perf_counter() - started

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
        chosen = read_session_settings(model) if settings is None else settings
        try:  # no CPU arena: it keeps every piece's blocks, grown in doubling regions, so pieces
            # sized from one row's footprint would not bound the peak (the outputs are the same)
            session = self._session(model, threads, settings={**(chosen or {}), "enable_cpu_mem_arena": False})
        except Exception as exc:  # one line naming the provider: a failure that teaches
            where = chosen_provider(self.provider, self.provider_options, chosen)[0]
            cause = " ".join(str(exc).split())
            raise TrialError(f"onnxruntime cannot load the model on {where}: {cause}") from exc
        if runner is not None:
            return runner(session, [dict(feed) for feed in feeds])
        names = [out.name for out in session.get_outputs()]
        names = names if every_output else names[:1]
        outputs: FeedOutputs = []
        cuttable = batch_follows_rows(session)  # a feed too big for the memory budget runs in pieces
        sized: dict[tuple, int] = {}  # rows a piece, measured on each shape's first feed
        for index, feed in enumerate(feeds):
            try:
                result = run_in_pieces(session, names, feed, sized) if cuttable else session.run(names, feed)
                outputs.append(dict(zip(names, result, strict=True)))
                progress.tick(index + 1, len(feeds), "evaluation batches")
            except Exception as exc:  # the original too: then a one-line error, not a traceback
                shapes = {name: tuple(value.shape) for name, value in feed.items()}
                cause = " ".join(str(exc).split())  # onnxruntime's messages may span lines
                raise TrialError(f"onnxruntime failed on evaluation feed {index} {shapes}: {cause}") from exc
        return outputs

    def time(self, request: TimingRequest) -> np.ndarray:
        """Seconds, one row per model, one column per round: side by side, or until decided."""
        if request.threshold is not None:
            return rounds.time_until_decided(request, self.provider, self.provider_options)
        return time_side_by_side(
            list(request.models),
            request.feed,
            request.spec,
            runner=request.runner,
            provider=self.provider,
            provider_options=self.provider_options,
            settings=request.settings,
            deadline=request.deadline,
            min_rounds=request.min_rounds,
            settled=request.settled,
        )

    def peak_memory_mb(
        self, model: Path, feed: dict[str, np.ndarray], threads: int, settings: Mapping[str, Any] | None = None
    ) -> float:
        return self._memory.measure(
            model, feed, threads, read_session_settings(model) if settings is None else settings
        )
