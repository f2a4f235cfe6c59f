"""One timing path: the search's paired decisions and the speed ceilings time through the run's
backend (its provider, or a target's server), and a backend's figures never stand in for another's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantune.evaluate.backend import LocalBackend
from quantune.evaluate.latency import LatencySpec
from quantune.evaluate.rounds import decide_in_chunks, ratio_medians
from test_ceilings_fast import build_chain


class _Elsewhere(LocalBackend):
    """This process's onnxruntime, fingerprinted as another target would be."""

    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "target": "elsewhere"}


def test_a_ceiling_is_timed_again_when_the_backend_changes(make_config, monkeypatch: pytest.MonkeyPatch) -> None:
    from quantune.config import load_config
    from quantune.engine.probes import _ceilings
    from quantune.engine.setup import build_run

    config = make_config([{"name": "static_quant", "search": True}], search={"strategy": "quantune"})
    parts = build_run(load_config(config))
    context = parts.context
    timed: list[dict[str, Any]] = []

    def counted(backend: Any) -> Any:
        real = backend.time_until_decided

        def timing(*args: Any, **kwargs: Any) -> np.ndarray:
            timed.append(backend.fingerprint())
            return real(*args, **kwargs)

        monkeypatch.setattr(backend, "time_until_decided", timing)
        return backend

    counted(context.evaluator.backend)
    items = [({"static_quant.per_channel": True}, ("static_quant",))]
    first = _ceilings(context, parts.plan, items, 0.97, None)
    assert first[0] is not None and first[0] > 0
    assert _ceilings(context, parts.plan, items, 0.97, None) == first and len(timed) == 1  # read from the cache
    context.evaluator.backend = counted(_Elsewhere())
    _ceilings(context, parts.plan, items, 0.97, None)
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
        lambda models, chunk: backend.timings(models, feed, chunk, None),
        light,
        [broken, twin],
        spec,
        threshold=0.97,
        max_rounds=8,
    )
    assert timings.shape[0] == 3 and 5 <= timings.shape[1] <= 8
    assert np.isnan(timings[1]).all() and not np.isnan(timings[2, :5]).any()
    medians = ratio_medians(timings)
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
        timings = backend.time_until_decided(light, [broken, twin], feed, spec, None, threshold=0.97, max_rounds=8)
    finally:
        backend.close()
    assert timings.shape[0] == 3 and 5 <= timings.shape[1] <= 8
    assert np.isnan(timings[1]).all() and not np.isnan(timings[2, :5]).any()
