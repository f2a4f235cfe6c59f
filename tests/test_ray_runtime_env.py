"""``executor.runtime_env``: the files a user's script reaches by path (its parent folder on
``sys.path``, a file beside ``__file__``) reach every Ray node only through it. The checks of the
field, where a node finds each script and the lanes' refusal of unlike nodes are pure; the runs
are on a simulated cluster (a head that runs nothing, two worker nodes that never see the engine's disk)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from quantune.config import load_config
from quantune.engine.executors.ray_cargo import _scripts, for_nodes, on_node, script_places
from quantune.engine.executors.worker import WorkerSpec
from quantune.engine.trials.ray_env import hinted
from quantune.errors import ConfigError, QuantuneError

BASE = {"model": "m.onnx", "data": {"evaluation": "e.npz"}, "passes": [{"name": "dynamic_quant"}]}


def _load(executor: dict[str, Any], base_dir: Path) -> Any:
    (base_dir / "run.yaml").write_text(__import__("json").dumps({**BASE, "executor": executor}))
    return load_config(base_dir / "run.yaml")


@pytest.mark.parametrize(
    ("executor", "line"),
    [
        (
            {"kind": "process", "runtime_env": {"env_vars": {"A": "1"}}},
            r"executor\.runtime_env: a Ray runtime_env needs executor\.kind: ray \(not 'process'\)",
        ),
        (
            {"kind": "ray", "runtime_env": {"working_dir": "gone"}},
            r"executor\.runtime_env\.working_dir: nothing at 'gone' \(looked for .*/cfg/gone\)",
        ),
        (
            {"kind": "ray", "runtime_env": {"py_modules": ["s3://bucket/lib.zip", "../lib.py"]}},
            r"executor\.runtime_env\.py_modules\[1\]: nothing at '\.\./lib\.py' \(looked for .*/lib\.py\)",
        ),
        ({"kind": "ray", "runtime_env": {"working_dir": ["a"]}}, r"executor\.runtime_env: working_dir must be"),
    ],
)
def test_a_wrong_runtime_env_is_one_line_naming_the_field(tmp_path: Path, executor: dict, line: str) -> None:
    (tmp_path / "cfg").mkdir()
    with pytest.raises(ConfigError, match=line) as caught:
        _load(executor, tmp_path / "cfg")
    assert "\n" not in str(caught.value)


def test_the_runtime_envs_local_paths_are_the_config_folders(tmp_path: Path) -> None:
    (tmp_path / "shared").mkdir()
    (tmp_path / "cfg").mkdir()
    (tmp_path / "lib.py").write_text("")
    env = {"working_dir": "../shared", "py_modules": ["../lib.py", "gcs://_ray_pkg_x.zip"], "env_vars": {"A": "1"}}
    loaded = _load({"kind": "ray", "runtime_env": env}, tmp_path / "cfg")
    assert loaded.runtime_env() == {
        "working_dir": str(tmp_path / "shared"),
        "py_modules": [str(tmp_path / "lib.py"), "gcs://_ray_pkg_x.zip"],
        "env_vars": {"A": "1"},
    }
    assert loaded.config.executor.runtime_env == env  # (as the user wrote it: the run's identity, its report)


def _project(tmp_path: Path) -> Path:
    """A metric that, like many, reaches files by path: a module of its parent folder (the folder put
    on sys.path) and a file beside itself (by ``__file__``); a plugin outside that folder."""
    project = tmp_path / "project"
    (project / "case").mkdir(parents=True)
    (project / "wd_shared.py").write_text("import numpy as np\n\ndef spread(y, w):\n    return float(np.std(y) * w)\n")
    np.save(project / "case" / "weight.npy", np.array(0.5))
    (project / "case" / "metric.py").write_text(
        "import sys\nfrom pathlib import Path\n\nimport numpy as np\n\n"
        "sys.path.insert(0, str(Path(__file__).resolve().parent.parent))\nimport wd_shared\n\n"
        "WEIGHT = Path(__file__).with_name('weight.npy')\n\n"
        "def score(outputs, data):\n    return wd_shared.spread(outputs['y'], float(np.load(WEIGHT)))\n"
    )
    return project


def test_a_script_inside_the_working_dir_is_found_in_the_nodes_copy_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = _project(tmp_path)
    (tmp_path / "plugin.py").write_text("")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "runner.py").write_text("def run(session, feeds):\n    return []\n")
    (project / "case" / "runner.py").symlink_to(elsewhere / "runner.py")  # a link inside: by the name given
    config = {
        **BASE,
        "evaluation": {"metric": "project/case/metric.py:score", "runner": "project/case/runner.py:run"},
        "plugins": ["plugin.py"],
        "executor": {"kind": "ray", "runtime_env": {"working_dir": "project"}},
    }
    (tmp_path / "run.yaml").write_text(__import__("json").dumps(config))
    loaded = load_config(tmp_path / "run.yaml")
    shipped = for_nodes(WorkerSpec(loaded, "key")).loaded.config
    assert shipped.evaluation.metric == "@working_dir/case/metric.py:score"
    assert shipped.evaluation.runner == "@working_dir/case/runner.py:run"
    assert shipped.plugins == [f"scripts/{str(tmp_path / 'plugin.py').lstrip('/')}"]  # outside: as before
    node = tmp_path / "node-cwd"
    node.mkdir()
    monkeypatch.chdir(node)  # Ray makes a task's working directory its copy of the working_dir
    assert on_node(shipped.evaluation.metric) == f"{node}/case/metric.py:score"
    assert on_node(shipped.plugins[0]) == shipped.plugins[0]
    # the cargo carries only what Ray does not: the plugin outside the working_dir
    assert sorted(_scripts(loaded)) == [str(tmp_path / "plugin.py").lstrip("/")]
    # a class of a script (a stage's job names it) is found where the node imported that script
    places = script_places(loaded)
    assert places[str(project / "case" / "metric.py")] == "@working_dir/case/metric.py"
    assert places[str(elsewhere / "runner.py")] == "@working_dir/case/runner.py"


def test_a_runtime_env_ray_does_not_take_is_one_line_naming_the_field() -> None:
    pytest.importorskip("ray")
    from quantune.engine.trials.ray_env import uploaded

    with pytest.raises(QuantuneError, match=r"^executor\.runtime_env: Ray does not take it: TypeError: .*env_vars"):
        uploaded({"env_vars": {"THREADS": 1}})  # (checked before any task: a number, not a string)
    assert uploaded({"env_vars": {"THREADS": "1"}, "excludes": ["*.npz"]}) == {"env_vars": {"THREADS": "1"}}


def test_a_node_that_misses_a_file_says_to_name_it_in_the_runtime_env() -> None:
    error = "ray task failed: QuantuneError: evaluation.metric: importing 'x.py' failed: ModuleNotFoundError: No mo"
    assert "executor.runtime_env (working_dir, py_modules" in hinted(error)
    assert hinted(hinted(error)) == hinted(error)  # once
    assert hinted("metric failed: ValueError: bad shape") == "metric failed: ValueError: bad shape"
    assert hinted(None) is None


@pytest.mark.parametrize("differ", ["quantune", "onnxruntime", "cpu_flags"])
def test_target_nodes_that_differ_are_refused_in_one_line_naming_the_field(
    monkeypatch: pytest.MonkeyPatch, differ: str
) -> None:
    """Each node's identity comes from its lane actor (faked here: one machine has one identity)."""
    ray = pytest.importorskip("ray")
    from quantune.engine.trials import ray_target

    same = {"quantune": "1.0", "onnxruntime": "1.20", "cpu_flags": "sse avx2"}
    identities = iter([{**same, "node": "host-a"}, {**same, differ: "other", "node": "host-b"}])
    created: list[dict[str, Any]] = []

    def remote(_cls: Any) -> Any:
        def options(**kwargs: Any) -> Any:
            created.append(kwargs)
            identity = next(identities)
            return SimpleNamespace(remote=lambda *a: SimpleNamespace(identity=SimpleNamespace(remote=lambda: identity)))

        return SimpleNamespace(options=options)

    nodes = [{"NodeID": name * 56, "Resources": {"lanes": 1.0}} for name in "ab"]  # (hex ids)
    monkeypatch.setattr(ray, "remote", remote)
    monkeypatch.setattr(ray, "get", lambda value: value)
    monkeypatch.setattr(ray_target, "check_target", lambda resource: None)
    monkeypatch.setattr(ray_target, "target_nodes", lambda resource: nodes)
    with pytest.raises(QuantuneError) as caught:
        ray_target.open_lanes("lanes", "CPUExecutionProvider", {})
    message = str(caught.value)
    assert message.startswith(f"executor.target: the nodes holding 'lanes' differ in {differ} (host-a and host-b)")
    assert "\n" not in message
    # lanes run no user script, so no runtime_env: a lane of another run (another env) is reused, never
    # a second actor waiting for the node's whole target resource the first one holds
    assert created and all("runtime_env" not in kwargs for kwargs in created)
