"""Where evaluations run: this process's onnxruntime, or a target environment's.

The :class:`~quantune.evaluate.Evaluator` decides *what* is measured (metrics, latency, size,
memory); a backend decides *where* a model runs. :class:`LocalBackend` opens sessions here,
through :func:`~quantune.evaluate.session.open_session`, on the configured execution
provider. :class:`TargetBackend` sends each model to an evaluation server running under
``target.python`` (``target_server.py``: numpy and onnxruntime only), so the original and
every candidate are scored and timed with the target's onnxruntime build and provider while
passes still run here. Both measure peak memory in a fresh process (the same server script in
its one-shot mode), so the figure never includes what the measuring process already holds.

A backend's :meth:`fingerprint` (provider, its options, onnxruntime version, timed threads) is
part of every evaluation cache key: figures from one provider or build never stand in for another's.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from quantune.errors import ConfigError, TrialError
from quantune.evaluate.budget import batch_follows_rows, rows_per_run, run_in_pieces
from quantune.evaluate.feeds import FeedOutputs
from quantune.evaluate.latency import LatencySpec, latency_lane, time_side_by_side
from quantune.evaluate.session import DEFAULT_PROVIDER, open_session
from quantune.evaluate.session_file import read_session_settings
from quantune.evaluate.target_client import TargetClient, TargetFault, TargetUnavailable
from quantune.evaluate.target_server import cpu_name

Feeds = list[dict[str, np.ndarray]]


class Backend(Protocol):
    provider: str

    def fingerprint(self) -> dict[str, Any]: ...
    def describe(self) -> dict[str, Any]: ...
    def check(self) -> None: ...
    def outputs(
        self, model: Path, feeds: Feeds, *, threads: int, runner: Callable | None, every_output: bool = True
    ) -> FeedOutputs: ...
    def timings(
        self, models: list[Path], feed: dict[str, np.ndarray], spec: LatencySpec, runner: Callable | None
    ) -> np.ndarray: ...
    def peak_memory_mb(self, model: Path, feed: dict[str, np.ndarray], threads: int) -> float: ...


_SHARED: dict[tuple[str, str, int | None], TargetClient] = {}


def shared_client(python: str, role: str, *, timeout_s: float, memory_limit_mb: int | None) -> TargetClient:
    """One server per interpreter, role (``evaluate`` or ``memory``) and limit in this process,
    however many evaluators a process builds: idle servers would otherwise pile up."""
    key = (python, role, memory_limit_mb)
    client = _SHARED.get(key)
    if client is None:
        log_dir = Path(tempfile.mkdtemp(prefix="quantune-target-log-"))
        client = TargetClient(python, log_dir / f"{role}.log", timeout_s=timeout_s, memory_limit_mb=memory_limit_mb)
        _SHARED[key] = client
        atexit.register(client.stop)
        atexit.register(shutil.rmtree, log_dir, True)
    client.timeout_s = timeout_s
    return client


class _Scratch:
    """A private folder for arrays and requests exchanged with server processes, removed at exit."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="quantune-target-"))
        self._written: dict[int, tuple[object, Path, list[list[str]]]] = {}  # the evaluation and latency feeds
        self._count = 0
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.dir), True)  # at exit, or when dropped

    def path(self, suffix: str) -> Path:
        self._count += 1
        return self.dir / f"{self._count}{suffix}"

    def arrays(self, feeds: Feeds) -> tuple[Path, list[list[str]]]:
        """``feeds`` written once as ``.npz`` (kept while the same list object is asked for again)."""
        known = self._written.get(id(feeds))
        if known is not None and known[0] is feeds:
            return known[1], known[2]
        if len(self._written) >= 4:  # not the run's feeds: forget them (and their file)
            for _, (_, stale, _) in self._written.items():
                stale.unlink(missing_ok=True)
            self._written.clear()
        path = self.path(".npz")
        layout = [[str(name) for name in feed] for feed in feeds]
        arrays = [np.ascontiguousarray(value) for feed in feeds for value in feed.values()]
        np.savez(path, **{f"a{index}": value for index, value in enumerate(arrays)})
        self._written[id(feeds)] = (feeds, path, layout)
        return path, layout

    def close(self) -> None:
        self._finalizer()


def _read_outputs(path: Path, layout: list[list[str]]) -> FeedOutputs:
    with np.load(path, allow_pickle=False) as data:
        arrays = [data[f"a{index}"] for index in range(len(data.files))]
    outputs, position = [], 0
    for names in layout:
        outputs.append({name: arrays[position + offset] for offset, name in enumerate(names)})
        position += len(names)
    return outputs


class _MemoryProbe:
    """Peak memory of a fresh session, measured by the server script's one-shot mode."""

    def __init__(
        self,
        client: TargetClient,
        scratch: _Scratch,
        provider: str,
        options: Mapping[str, Any],
        runner: str | None = None,
    ) -> None:
        self.client, self.scratch = client, scratch
        self.provider, self.provider_options = provider, dict(options)
        self.runner = runner  # "/abs/script.py:function": the model is driven as the evaluation runner drives it

    def measure(self, model: Path, feed: dict[str, np.ndarray], threads: int, settings: Mapping | None) -> float:
        path, layout = self.scratch.arrays([feed])
        request = {
            "model": str(model),
            "feed": str(path),
            "names": layout[0],
            "threads": threads,
            "provider": self.provider,
            "provider_options": self.provider_options,
            "settings": dict(settings or {}),
            "runner": self.runner,
        }
        if os.name == "posix":  # forked from a server that stays up: no interpreter start per measurement
            answer = self.client.request("memory", **request)
        else:
            request_path = self.scratch.path(".json")
            request_path.write_text(json.dumps(request))
            try:
                answer = self.client.one_shot(request_path)
            finally:
                request_path.unlink(missing_ok=True)
        return round(float(answer["peak_memory_mb"]), 2)


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
        self.scratch = _Scratch()
        client = shared_client(sys.executable, "memory", timeout_s=timeout_s, memory_limit_mb=None)
        self._memory = _MemoryProbe(client, self.scratch, provider, self.provider_options, runner)

    def fingerprint(self) -> dict[str, Any]:
        return {"provider": self.provider, "provider_options": self.provider_options, "onnxruntime": ort.__version__}

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

    def _session(self, model: Path, threads: int, timing: bool = False) -> ort.InferenceSession:
        return open_session(
            model,
            threads=threads,
            timing=timing,
            settings=read_session_settings(model),
            provider=self.provider,
            provider_options=self.provider_options,
        )

    def outputs(
        self, model: Path, feeds: Feeds, *, threads: int, runner: Callable | None, every_output: bool = True
    ) -> FeedOutputs:
        try:
            session = self._session(model, threads)
        except Exception as exc:
            raise TrialError(f"onnxruntime cannot load the model: {exc}") from exc
        if runner is not None:
            return runner(session, [dict(feed) for feed in feeds])
        names = [out.name for out in session.get_outputs()]
        names = names if every_output else names[:1]
        outputs: FeedOutputs = []
        cuttable = batch_follows_rows(session)  # a feed too big for the memory budget runs in pieces
        for index, feed in enumerate(feeds):
            try:
                rows = rows_per_run(model, feed) if cuttable else None
                outputs.append(dict(zip(names, run_in_pieces(session, names, feed, rows), strict=True)))
            except Exception as exc:  # the original too: then a one-line error, not a traceback
                shapes = {name: tuple(value.shape) for name, value in feed.items()}
                cause = " ".join(str(exc).split())  # onnxruntime's messages may span lines
                raise TrialError(f"onnxruntime failed on evaluation feed {index} {shapes}: {cause}") from exc
        return outputs

    def timings(
        self, models: list[Path], feed: dict[str, np.ndarray], spec: LatencySpec, runner: Callable | None
    ) -> np.ndarray:
        return time_side_by_side(
            models, feed, spec, runner=runner, provider=self.provider, provider_options=self.provider_options
        )

    def peak_memory_mb(self, model: Path, feed: dict[str, np.ndarray], threads: int) -> float:
        return self._memory.measure(model, feed, threads, read_session_settings(model))


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
        self.scratch = _Scratch()
        self.client = shared_client(python, "evaluate", timeout_s=timeout_s, memory_limit_mb=memory_limit_mb)
        memory_client = shared_client(python, "memory", timeout_s=timeout_s, memory_limit_mb=memory_limit_mb)
        self._memory = _MemoryProbe(memory_client, self.scratch, provider, self.provider_options, runner)
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

    def _load(self, model: Path, threads: int, timing: bool) -> int:
        answer = self.client.request(
            "load",
            model=str(model),
            threads=threads,
            timing=timing,
            settings=read_session_settings(model) or {},
            provider=self.provider,
            provider_options=self.provider_options,
        )
        used = answer["providers"]
        if not used or used[0] != self.provider:  # e.g. CUDA requested, no GPU: onnxruntime fell back
            raise TargetFault(
                f"target.provider: '{self.provider}' did not take the model; onnxruntime put it on {used}"
            )
        return int(answer["session"])

    def outputs(
        self, model: Path, feeds: Feeds, *, threads: int, runner: Callable | None, every_output: bool = True
    ) -> FeedOutputs:
        """``every_output=False`` keeps only the first output of each feed (the target sends all)."""
        path, layout = self.scratch.arrays(feeds)
        out = self.scratch.path(".npz")
        try:
            try:
                session = self._load(model, threads, timing=False)
            except TargetFault as exc:
                if "target crashed" in str(exc) or "target timeout" in str(exc):
                    raise
                raise TargetFault(f"onnxruntime cannot load the model: {exc}") from None
            answer = self.client.request(
                "run", session=session, feeds=str(path), layout=layout, out=str(out), runner=self.runner
            )
            produced = _read_outputs(out, answer["layout"])
            return produced if every_output else [dict([next(iter(feed.items()))]) for feed in produced]
        finally:
            with contextlib.suppress(TargetFault):
                if self.client.process is not None:
                    self.client.request("free")
            out.unlink(missing_ok=True)

    def timings(
        self, models: list[Path], feed: dict[str, np.ndarray], spec: LatencySpec, runner: Callable | None
    ) -> np.ndarray:
        path, layout = self.scratch.arrays([feed])
        try:
            sessions = [self._load(model, spec.threads, timing=True) for model in models]
            with latency_lane():
                answer = self.client.request(
                    "time",
                    sessions=sessions,
                    feed=str(path),
                    names=layout[0],
                    warmup=spec.warmup,
                    repeats=spec.repeats,
                    runner=self.runner,
                )
        finally:
            with contextlib.suppress(TargetFault):
                if self.client.process is not None:
                    self.client.request("free")
        return np.asarray(answer["timings"], dtype=np.float64)

    def peak_memory_mb(self, model: Path, feed: dict[str, np.ndarray], threads: int) -> float:
        return self._memory.measure(model, feed, threads, read_session_settings(model))

    def close(self) -> None:
        """Stops the servers (the next request starts them again) and removes the scratch files."""
        self.client.stop()
        self._memory.client.stop()
        self.scratch.close()
