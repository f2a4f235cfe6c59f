"""Workers forked from a fork server with the heavy imports done (quantune/forkserver.py):
they start as a spawned worker would -- the parent's environment as it is when they start, the
same advice for a script that calls tune() unguarded (test_engine_scale.py) -- only sooner."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from pathlib import Path

import pytest

from quantune.engine.executors.stage import Isolation, run_stage
from quantune.forkserver import uses_fork_server, warm_up, worker_context


def _environment_and_modules(name: str) -> tuple[str | None, bool, bool, int]:
    return (
        os.environ.get(name),
        "onnxruntime.quantization" in sys.modules,
        "_quantune_symbolic_shape_infer" in sys.modules,
        os.getpid(),
    )


def _loaded_for(points: list[dict]) -> bool:
    """In a worker: whether the symbolic shape inference is loaded once ``load_in_background`` is done."""
    import threading

    from quantune.engine.measure.ahead import load_shapes_ahead

    load_shapes_ahead(None, points)
    for thread in threading.enumerate():
        if thread.name == "quantune-load-shapes":
            thread.join()
    return "_quantune_symbolic_shape_infer" in sys.modules


@pytest.mark.skipif("forkserver" not in mp.get_all_start_methods(), reason="no fork server on this platform")
def test_a_forked_worker_sees_the_environment_of_its_start_and_the_preloaded_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QUANTUNE_FORKSERVER", raising=False)
    warm_up()  # the server starts (and imports) before the variable below exists
    monkeypatch.setenv("QUANTUNE_TEST_SEEN", "after the server started")
    outcome = run_stage("probe", _environment_and_modules, "QUANTUNE_TEST_SEEN", isolation=Isolation(log_dir=tmp_path))
    assert outcome.ok, outcome.error
    seen, preloaded, symbolic, pid = outcome.value
    assert seen == "after the server started"
    assert preloaded  # imported once by the server, not by the worker
    # not sympy (0.3-0.4 s): the server forks no worker before its preload is done (issue 23)
    assert not symbolic
    assert pid != os.getpid()


@pytest.mark.skipif("forkserver" not in mp.get_all_start_methods(), reason="no fork server on this platform")
def test_a_worker_loads_the_symbolic_shape_inference_only_for_an_extended_pre_optimization(tmp_path: Path) -> None:
    warm_up()
    isolation = Isolation(log_dir=tmp_path)
    plain = run_stage(
        "probe", _loaded_for, [{"flow": "static_quant", "static_quant.per_channel": True}], isolation=isolation
    )
    extended = run_stage(
        "probe", _loaded_for, [{"flow": "dynamic_quant", "dynamic_quant.pre_optimize": "extended"}], isolation=isolation
    )
    assert plain.ok and extended.ok, (plain.error, extended.error)
    assert plain.value is False and extended.value is True


def test_which_points_need_the_symbolic_shape_inference_is_their_passes_trait() -> None:
    """Asked of the step's pass (``Pass.needs_symbolic_shapes``), not of a parameter's name: a step of
    another name runs dynamic quantization too, and another pass's ``pre_optimize`` needs nothing."""
    from quantune.engine.measure.ahead import needs_symbolic_shapes
    from quantune.passes.onnx.dynamic_quant import DynamicQuantization

    assert DynamicQuantization.needs_symbolic_shapes({"pre_optimize": "extended"})
    assert not DynamicQuantization.needs_symbolic_shapes({"pre_optimize": "none"})
    assert needs_symbolic_shapes([{"flow": "dq", "dq.pre_optimize": "extended"}], {"dq": "dynamic_quant"})
    assert not needs_symbolic_shapes([{"flow": "dq", "dq.pre_optimize": "extended"}], {})  # no pass named dq
    assert not needs_symbolic_shapes([{"static_quant.pre_optimize": "extended", "static_quant.per_channel": True}], {})


def test_workers_are_spawned_when_the_fork_server_is_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTUNE_FORKSERVER", "0")
    assert not uses_fork_server()
    assert worker_context().get_start_method() == "spawn"
    monkeypatch.setenv("QUANTUNE_FORKSERVER", "1")
    expected = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    assert worker_context().get_start_method() == expected


def test_a_script_read_from_stdin_gets_one_clear_error(tmp_path: Path, make_config) -> None:
    """Workers re-import the script that started them: from standard input there is none, and
    every worker died starting ("worker exited with code 1"); now the run says why before any work."""
    import subprocess

    config = make_config(executor={"kind": "process", "workers": 1})
    script = f"import quantune\nquantune.tune({config!r}, output={str(tmp_path / 'out')!r})\n"
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "'<stdin>' is no file" in done.stderr and "executor.kind: inline" in done.stderr
    assert not (tmp_path / "out").exists()  # nothing claimed


def test_a_fork_server_that_cannot_start_leaves_spawned_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    from multiprocessing import forkserver

    from quantune import forkserver as contexts

    def refuse() -> None:
        raise OSError("no Unix sockets here")

    monkeypatch.delenv("QUANTUNE_FORKSERVER", raising=False)
    monkeypatch.setattr(contexts, "_UNAVAILABLE", [])
    monkeypatch.setattr(forkserver, "ensure_running", refuse)
    warm_up()
    assert contexts._UNAVAILABLE == ["OSError: no Unix sockets here"]
    assert worker_context().get_start_method() == "spawn"


def test_whether_a_run_forks_its_workers_is_read_before_its_config_is_validated(tmp_path: Path, make_config) -> None:
    """``tune()`` starts the fork server before validating the config (0.2 s) when the run will fork
    workers -- read from a path, a dict, a validated config, the overrides or the executor argument."""
    from quantune.config import load_config
    from quantune.forkserver import will_fork

    config = {key: value for key, value in make_config().items() if key != "executor"}  # the default: process
    assert will_fork(config) and will_fork(load_config(config)) and will_fork(load_config(config).config)
    inline = {**config, "executor": {"kind": "inline"}}
    assert not will_fork(inline) and not will_fork(load_config(inline))
    assert will_fork(inline, executor="process") and not will_fork(config, overrides={"executor.kind": "ray"})
    path = tmp_path / "quantune.yaml"
    path.write_text("model: m.onnx\nexecutor: {kind: inline}\n")
    assert not will_fork(path) and not will_fork(str(path))
    assert will_fork(tmp_path / "missing.yaml")  # unreadable: the validation says what is wrong
