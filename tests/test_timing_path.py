"""One timing path: the search's paired decisions and the speed ceilings time through the run's
backend (its provider, or a target's server), and a backend's figures never stand in for another's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantune.evaluate.backend import LocalBackend
from quantune.evaluate.latency import LatencySpec, TimingRequest
from quantune.evaluate.rounds import ceiling_medians, decide_in_chunks
from test_ceilings_fast import build_chain, in_batches


class _Elsewhere(LocalBackend):
    """This process's onnxruntime, fingerprinted as another target would be."""

    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "target": "elsewhere"}


def test_a_ceiling_is_timed_again_when_the_backend_changes(make_config, monkeypatch: pytest.MonkeyPatch) -> None:
    from quantune.config import load_config
    from quantune.engine.measure.probes import time_ceilings
    from quantune.engine.trials.setup import build_run

    config = make_config([{"name": "static_quant", "search": True}], search={"strategy": "quantune"})
    parts = build_run(load_config(config))
    context = parts.context
    timed: list[dict[str, Any]] = []

    def counted(backend: Any) -> Any:
        real = backend.time

        def timing(*args: Any, **kwargs: Any) -> np.ndarray:
            timed.append(backend.fingerprint())
            return real(*args, **kwargs)

        monkeypatch.setattr(backend, "time", timing)
        return backend

    counted(context.evaluator.backend)
    items = [({"static_quant.per_channel": True}, ("static_quant",))]
    first = time_ceilings(context, parts.plan, items, 0.97, None)
    assert first[0] is not None and first[0] > 0
    assert time_ceilings(context, parts.plan, items, 0.97, None) == first and len(timed) == 1  # read from the cache
    context.evaluator.backend = counted(_Elsewhere())
    time_ceilings(context, parts.plan, items, 0.97, None)
    assert len(timed) == 2 and timed[1].get("target") == "elsewhere"  # not the CPU figures of the first


def test_rounds_in_chunks_time_what_the_backend_can_run(tmp_path: Path) -> None:
    """A target times whole batches of rounds: the same decision rule, a few rounds at a time, and a
    candidate the backend cannot load sits out (a NaN row) while the others are timed."""
    light = build_chain(tmp_path / "light.onnx", 1, 64)
    twin = build_chain(tmp_path / "twin.onnx", 1, 64)
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model")
    backend = LocalBackend()
    feed = {"x": np.ones((4, 64), np.float32)}
    spec = LatencySpec(warmup=1, repeats=8, threads=1)
    timings = decide_in_chunks(
        in_batches(lambda models, chunk: backend.time(TimingRequest(tuple(models), feed, chunk))),
        TimingRequest((light, broken, twin), feed, spec, threshold=0.97, max_rounds=8),
    )
    assert timings.shape[0] == 3 and 5 <= timings.shape[1] <= 8
    assert np.isnan(timings[1]).all() and not np.isnan(timings[2, :5]).any()
    medians = ceiling_medians(timings, 0.97)
    assert medians[0] is None and medians[1] is not None and medians[1] > 0


def test_a_target_times_the_ceilings_on_its_own_onnxruntime(tmp_path: Path) -> None:
    """``target.python`` (here this interpreter, as a server): the ceilings' rounds run there, not here."""
    import sys

    from quantune.evaluate import TargetBackend

    light = build_chain(tmp_path / "light.onnx", 1, 64)
    twin = build_chain(tmp_path / "twin.onnx", 1, 64)
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model")
    backend = TargetBackend(sys.executable)
    try:
        feed = {"x": np.ones((4, 64), np.float32)}
        spec = LatencySpec(warmup=1, repeats=8, threads=1)
        timings = backend.time(TimingRequest((light, broken, twin), feed, spec, None, threshold=0.97, max_rounds=8))
    finally:
        backend.close()
    assert timings.shape[0] == 3 and 5 <= timings.shape[1] <= 8
    assert np.isnan(timings[1]).all() and not np.isnan(timings[2, :5]).any()


def test_a_target_opens_each_model_once_for_all_its_chunks_of_rounds(tmp_path: Path, monkeypatch) -> None:
    """The rounds come in chunks (5, then 3 at a time); each model's session is loaded once for them
    all and freed at the end (OpenVINO compiled every model again for each chunk: 24.8 s for 20 rounds)."""
    import sys

    from quantune.evaluate import TargetBackend

    light = build_chain(tmp_path / "light.onnx", 1, 64)
    twin = build_chain(tmp_path / "twin.onnx", 1, 64)
    backend = TargetBackend(sys.executable)
    requests: list[tuple[str, dict[str, Any]]] = []
    real = backend.client.request
    monkeypatch.setattr(backend.client, "request", lambda op, **kw: requests.append((op, kw)) or real(op, **kw))
    try:
        feed = {"x": np.ones((4, 64), np.float32)}
        spec = LatencySpec(warmup=2, repeats=14, threads=1)
        from quantune.evaluate import rounds

        # never decided: every chunk up to max_rounds runs
        monkeypatch.setattr(
            rounds,
            "_still_timed",
            lambda timings, request, usable: ([True, True], False),
        )
        timings = backend.time(TimingRequest((light, twin), feed, spec, None, threshold=0.97, max_rounds=14))
    finally:
        backend.close()
    ops = [op for op, _ in requests]
    timed = [kw for op, kw in requests if op == "time"]
    assert timings.shape == (2, 14) and len(timed) == 4  # 5 + 3 + 3 + 3 rounds
    assert ops.count("load") == 2 and ops[-1] == "free" and ops.count("free") == 1
    assert [kw["warmup"] for kw in timed] == [2, 0, 0, 0]  # warmed once
    assert all(kw["sessions"] == timed[0]["sessions"] for kw in timed)


def test_sessions_open_on_the_cores_at_once_in_order_with_failures_in_place() -> None:
    """``open_all``: every model's session opened before any timing, on the machine's cores at once
    (a ceiling session's six MiniLM sessions took 0.35 s one after the other, 0.20 s two at a time);
    results keep the models' order, and a failure comes back in its place, not raised."""
    import os
    import threading

    from quantune.evaluate.latency import open_all

    names: list[str] = []

    def opener(value: int) -> Any:
        def run() -> int:
            names.append(threading.current_thread().name)
            if value == 2:
                raise ValueError("cannot load model 2")
            return value * 10

        return run

    results = open_all([opener(v) for v in range(4)])
    assert results[:2] == [0, 10] and results[3] == 30
    assert isinstance(results[2], ValueError) and "model 2" in str(results[2])
    if (os.cpu_count() or 1) > 1:
        assert all(name.startswith("quantune-open") for name in names)  # not the caller's thread
