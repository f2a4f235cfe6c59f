"""The Ray executor on a multi-node cluster simulated on this machine (``ray.cluster_utils.Cluster``):
a head that runs no trial and two worker nodes, which are never given the engine's cache."""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
import shutil
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantune
from conftest import build_mlp, mlp_inputs
from quantune.config import load_config
from quantune.engine.executors import ray_executor
from quantune.engine.executors.ray_cargo import for_nodes, pack, run_shipped, scratch_folder
from quantune.engine.executors.worker import WorkerSpec
from quantune.engine.trials.runner import TrialRunner
from quantune.engine.trials.setup import build_run
from quantune.engine.trials.trial import Trial

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

ROOT = Path(__file__).resolve().parents[1]

# A pass that copies its model and notes where it ran, which paths it was given and where its file is; with a gate
# folder, it first says it started and waits until the test creates the folder's "go" file (or "go-NODE" for its node).
SPY_PLUGIN = """
import json, os, shutil, time
from pathlib import Path
import ray
from quantune import Pass, PassConfig, register_pass

class SpyConfig(PassConfig):
    notes: str = ""
    gate: str = ""

@register_pass
class Spy(Pass):
    name = "spy"
    Config = SpyConfig
    def run(self, config, model_in, model_out, context):
        node = ray.get_runtime_context().get_node_id()
        paths = [str(model_in), str(model_out), str(context.work_dir), str(context.cache_dir)]
        seen = {"node": node, "paths": paths, "plugin": __file__}
        with open(config.notes, "a") as notes:
            notes.write(json.dumps(seen) + "\\n")
        if config.gate:
            gate = Path(config.gate)
            (gate / f"started-{os.getpid()}").write_text(node)
            while not (gate / "go").exists() and not (gate / f"go-{node}").exists():  # opened by the test
                time.sleep(0.05)
        shutil.copyfile(model_in, model_out)
"""


@pytest.fixture(scope="module")
def cluster() -> Any:
    made = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    workers = [made.add_node(num_cpus=1) for _ in range(2)]
    ray.init(address=made.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield made, workers
    nodes = [node["NodeID"] for node in ray.nodes()]
    ray.shutdown()
    made.shutdown()
    for node in nodes:  # the scratch folders the nodes leave (a real node's go with it)
        shutil.rmtree(scratch_folder(node), ignore_errors=True)


def _config(tmp_path: Path, kind: str, **spy: str) -> dict[str, Any]:
    model = build_mlp(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "calib.npz", x=mlp_inputs(32, seed=1))
    np.savez(tmp_path / "eval.npz", x=mlp_inputs(32, seed=2))
    plugin = tmp_path / "spy.py"
    plugin.write_text(SPY_PLUGIN)
    # a metric split in two files: the nodes get both
    (tmp_path / "metric.py").write_text(
        "from helper import spread\n\ndef score(outputs, data):\n    return spread(outputs['y'])\n"
    )
    (tmp_path / "helper.py").write_text("import numpy as np\n\ndef spread(y):\n    return float(np.std(y))\n")
    return {
        "model": str(model),
        "data": {
            "calibration": str(tmp_path / "calib.npz"),
            "evaluation": str(tmp_path / "eval.npz"),
            "batch_size": 16,
        },
        "evaluation": {
            "metric": f"{tmp_path / 'metric.py'}:score",
            "latency": {"warmup": 1, "repeats": 3, "threads": 1},
        },
        "criterion": {"type": "absolute", "tolerable_loss": 0.5},
        "objective": "size",  # exact: the same answer wherever the trials ran
        "passes": [
            {"name": "spy", "params": {"notes": str(tmp_path / f"{kind}-notes.jsonl"), **spy}},
            {"name": "dynamic_quant", "params": {"weight_type": {"search": ["int8", "uint8"]}}},
        ],
        "plugins": [str(plugin)],
        "search": {"sampler": "exhaustive", "seed": 0},
        "cache_dir": str(tmp_path / f"cache-{kind}"),
        "executor": {"kind": kind, "workers": 2 if kind == "ray" else 1, "trial_timeout_s": 300},
    }


def _notes(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_cluster_run_never_gives_workers_the_engines_cache_and_matches_a_local_run(
    tmp_path: Path, cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = ray.get_runtime_context().get_node_id()
    shipped: list[Any] = []  # what the tasks receive besides the trial: the spec and the cargo
    for name in ("for_nodes", "pack"):
        real = getattr(ray_executor, name)
        monkeypatch.setattr(ray_executor, name, lambda *a, real=real: shipped.append(real(*a)) or shipped[-1])
    # stopped after one trial, then resumed from the engine's run store: the first is replayed, not run again
    first = quantune.tune({**_config(tmp_path, "ray"), "stop": {"max_trials": 1}}, output=tmp_path / "out-ray")
    on_ray = quantune.tune(_config(tmp_path, "ray"), output=tmp_path / "out-ray")
    assert len(first.trials) == 1 and on_ray.replayed == 1 and len(on_ray.trials) == 2
    local = quantune.tune(_config(tmp_path, "process"), output=tmp_path / "out-local")

    driver_cache = str(tmp_path / "cache-ray")
    assert shipped and all(driver_cache.encode() not in pickle.dumps(part) for part in shipped)
    notes = _notes(tmp_path / "ray-notes.jsonl")
    assert notes and all(not path.startswith(driver_cache) for note in notes for path in note["paths"])
    assert all(not note["plugin"].startswith(str(tmp_path)) for note in notes)  # the node's copy of the plugin
    assert {note["node"] for note in notes} <= {node.node_id for node in cluster[1]}  # worker nodes only
    # the nodes compare with the original's outputs they were sent: none evaluated the original again
    scratch = [scratch_folder(note["node"]) for note in notes]
    assert [len(list(folder.rglob("outputs/*.npz"))) for folder in scratch] == [1] * len(scratch)
    # the records name the engine's copy of each model, and the engine timed each one
    ok = [t for t in on_ray.trials if t.status == "ok"]
    assert ok and all(t.model_path.startswith(driver_cache) and Path(t.model_path).is_file() for t in ok)
    assert all(head[:12] in t.nodes["timed"] and head[:12] not in t.nodes["built"] for t in ok)
    # the same answer as trials run here
    assert on_ray.verdict == local.verdict == "improved"
    assert on_ray.best.model_sha256 == local.best.model_sha256 and on_ray.best.params == local.best.params
    assert sorted(t.model_sha256 for t in on_ray.trials) == sorted(t.model_sha256 for t in local.trials)


def test_a_trial_on_a_removed_node_runs_again_elsewhere_and_counts_once(tmp_path: Path, cluster: Any) -> None:
    made, workers = cluster
    gate = tmp_path / "gate"
    gate.mkdir()
    removed: list[str] = []
    done = threading.Event()

    def remove_a_busy_node() -> None:
        """Once both trials wait at the gate (one on each node), the node of one of them goes; the gate
        opens for the other nodes only, so the lost node's trial can never finish there (a worker may
        outlive its node's raylet for a moment), only again elsewhere."""
        opened = False
        try:
            while len(list(gate.glob("started-*"))) < 2 and not done.wait(0.05):
                pass
            if not done.is_set():
                lost = next(gate.glob("started-*")).read_text()
                made.remove_node(next(node for node in workers if node.node_id == lost), allow_graceful=False)
                removed.append(lost)
                for node in workers:
                    if node.node_id != lost:
                        (gate / f"go-{node.node_id}").write_text("")
                opened = True
        finally:
            if not opened:
                (gate / "go").write_text("")

    remover = threading.Thread(target=remove_a_busy_node)
    remover.start()
    try:
        result = quantune.tune(_config(tmp_path, "ray", gate=str(gate)), output=tmp_path / "out")
    finally:
        done.set()
        remover.join()
        (gate / "go").write_text("")  # nothing waits at the gate after the run
    workers[:] = [node for node in workers if node.node_id not in removed]
    workers.append(made.add_node(num_cpus=1))  # (the cluster as the fixture made it, for any later test)
    assert removed, "the trials did not both reach the gate"
    assert sorted(t.number for t in result.trials) == [0, 1]  # nothing lost, nothing counted twice
    assert all(t.status == "ok" for t in result.trials), [t.error for t in result.trials]
    lost = removed[0][:12]
    assert all(lost not in t.nodes["built"] for t in result.trials)  # the lost node's trial ran again elsewhere
    assert any(note["node"].startswith(lost) for note in _notes(tmp_path / "ray-notes.jsonl"))


def test_a_node_with_another_quantune_builds_nothing_and_says_what_to_install(tmp_path: Path, cluster: Any) -> None:
    loaded = load_config(_config(tmp_path, "ray"))
    runner = TrialRunner(build_run(loaded).context)
    spec = WorkerSpec(loaded, uuid.uuid4().hex)  # (a key no worker has built a run for)
    cargo = dataclasses.replace(pack(runner, loaded), quantune="0.0.0")
    task = ray.remote(run_shipped).options(num_returns="streaming", num_cpus=1, max_retries=0)
    trial = Trial(0, ("spy", "dynamic_quant"), {"dynamic_quant.weight_type": "int8"})
    with pytest.raises(ray.exceptions.RayTaskError, match=r"has quantune \S+, the engine 0\.0\.0: install"):
        ray.get(next(task.remote(for_nodes(spec), [ray.put(cargo)], trial)))
    assert not (tmp_path / "ray-notes.jsonl").exists()  # nothing ran


def test_timings_spread_over_the_target_nodes_lanes_and_each_comparison_stays_on_one_node(
    tmp_path: Path, cluster: Any
) -> None:
    made, _ = cluster
    targets = [made.add_node(num_cpus=0, resources={"quantune_target": 1}) for _ in range(2)]
    try:
        config = _config(tmp_path, "ray")
        config["executor"]["target"] = "quantune_target"
        config["objective"] = "latency"  # the trials' timings, and the confirmation, decide the answer
        result = quantune.tune(config, output=tmp_path / "out")
    finally:
        for node in targets:
            made.remove_node(node)
    here = {node.node_id[:12] for node in targets}

    def target_of(node: str) -> str:
        (found,) = [name for name in here if name in node]  # exactly one target node
        return found

    saved = json.loads((tmp_path / "out" / "results.json").read_text())["target"]
    assert saved["timings_on"]["resource"] == "quantune_target" and len(saved["timings_on"]["nodes"]) == 2
    timed = saved["timed"]  # every timing the run made, its stage processes' too, each on one lane
    assert {target_of(entry["node"]) for entry in timed} == here  # the timings landed on both target nodes
    ok = [t for t in result.trials if t.status == "ok"]
    alone = {(entry["models"][0], entry["node"]) for entry in timed if len(entry["models"]) == 1}
    assert ok and all((str(t.model_path), t.nodes["timed"]) in alone for t in ok)  # each record names its node
    original = str(tmp_path / "mlp.onnx")
    assert timed[0]["models"] == [original]  # the original's, in the baseline's stage process
    side_by_side = [entry for entry in timed if len(entry["models"]) > 1]  # paired: wholly on one node
    assert side_by_side and all(target_of(entry["node"]) for entry in side_by_side)
    assert timed[-1]["models"][0] == original and len(timed[-1]["models"]) > 1  # the confirmation, all together
    assert saved["timed_on"] == timed[-1]["node"]  # results.json names the confirmation's node
    assert result.verdict in ("improved", "keep_original")
    assert "unconfirmed" not in json.dumps(saved)


def test_a_target_no_node_holds_is_one_line_naming_the_field(tmp_path: Path, cluster: Any) -> None:
    config = _config(tmp_path, "ray")
    config["executor"]["target"] = "no_such_resource"
    with pytest.raises(quantune.QuantuneError, match=r"executor\.target: no node of the Ray cluster holds"):
        quantune.tune(config, output=tmp_path / "out")


def test_a_lost_target_nodes_timings_go_on_at_the_other_target_nodes_lanes(tmp_path: Path, cluster: Any) -> None:
    from quantune.engine.trials.ray_target import RayTargetBackend
    from quantune.evaluate.backend import LocalBackend
    from quantune.evaluate.latency import LatencySpec, TimingRequest

    made, _ = cluster
    targets = sorted(
        (made.add_node(num_cpus=0, resources={"lane_test": 1}) for _ in range(2)), key=lambda node: node.node_id
    )
    try:
        backend = RayTargetBackend(LocalBackend(), "lane_test")
        model = build_mlp(tmp_path / "mlp.onnx")
        feed, spec = {"x": mlp_inputs(4, seed=0)}, LatencySpec(warmup=1, repeats=3, seconds=0.5)
        first = [backend.time(TimingRequest((model,), feed, spec)) for _ in range(2)]  # one on each lane
        made.remove_node(targets[0], allow_graceful=False)  # the first lane's node (the first by id)
        lost = targets[0].node_id
        while any(node["NodeID"] == lost and node["Alive"] for node in ray.nodes()):  # until Ray knows
            threading.Event().wait(0.05)
        second = [backend.time(TimingRequest((model,), feed, spec)) for _ in range(2)]  # the first asks the lost lane
    finally:
        for node in targets[1:]:
            made.remove_node(node)
    assert all(t.shape[0] == 1 and np.isfinite(t).all() for t in first + second)
    nodes = [entry["node"] for entry in backend.timed]
    names = [node.node_id[:12] for node in targets]
    assert [name for entry in nodes for name in names if name in entry] == [names[0], names[1], names[1], names[1]]


_ONE_CEILING = {"quant_format": "QDQ", "activation_type": "int8", "calibrate_method": "MinMax"}


def _accuracy_config(tmp_path: Path, kind: str, spy: bool = True) -> dict[str, Any]:
    """An accuracy-driven run that reaches its sensitivity stage, the spy's step before its quantization."""
    plugin = tmp_path / "spy.py"
    plugin.write_text(SPY_PLUGIN)
    digits = ROOT / "examples" / "digits"
    return {
        "model": str(ROOT / "examples" / "scaled_cnn" / "model.onnx"),
        "data": {"calibration": str(digits / "calib.npz"), "evaluation": str(digits / "eval.npz"), "batch_size": 64},
        "evaluation": {"metric": "top1", "latency": {"warmup": 1, "repeats": 2, "threads": 1}},
        "criterion": {"type": "relative", "tolerable_loss": 0.01},
        "objective": "size",  # exact: the same answer wherever the stages ran
        "passes": [
            *([{"name": "spy", "params": {"notes": str(tmp_path / f"{kind}-notes.jsonl")}}] if spy else []),
            # one ceiling: which flow the strategy builds on rests on no timing
            {"name": "static_quant", "search": True, "params": {**_ONE_CEILING, "per_channel": False}},
        ],
        "plugins": [str(plugin)],
        "search": {"sampler": "random", "seed": 0, "strategy": "quantune", "strategy_options": {"drop_slow": False}},
        "stop": {"max_trials": 6},
        "cache_dir": str(tmp_path / f"cache-{kind}"),
        # one trial at a time: the strategy is told its trials in the same order as the local run's
        "executor": {"kind": kind, "workers": 1, "trial_timeout_s": 300},
    }


def test_an_accuracy_runs_sensitivity_stage_runs_on_a_worker_node_and_gives_a_local_runs_answer(
    tmp_path: Path, cluster: Any
) -> None:
    on_ray = quantune.tune(_accuracy_config(tmp_path, "ray"), output=tmp_path / "out-ray")
    # (the local run without the spy, which records where it ran; the spy copies its model, so the same models)
    local = quantune.tune(_accuracy_config(tmp_path, "process", spy=False), output=tmp_path / "out-local")

    workers = {node.node_id[:12]: node.node_id for node in cluster[1]}
    log = (tmp_path / "out-ray" / "quantune.log").read_text()
    ran_on = re.findall(r"sensitivity stage ran on Ray node .* \((\w+)\)", log)
    assert ran_on and set(ran_on) <= set(workers)  # a worker node, not the driver (the head runs no task)
    assert not json.loads((tmp_path / "out-ray" / "results.json").read_text())["stage_errors"]
    # its report is in that node's scratch cache, none in the engine's: the node worked on its own copies
    assert not (tmp_path / "cache-ray" / "sensitivity").exists()
    reports = {
        path.name: path.read_text()
        for node in ran_on
        for path in scratch_folder(workers[node]).rglob("cache/sensitivity/*.json")
    }
    # the spy's step (its class from the node's copy of the plugin) ran on the nodes' files only, in the
    # sensitivity stage as in the trials
    driver = str(tmp_path)
    notes = _notes(tmp_path / "ray-notes.jsonl")
    assert {note["node"][:12] for note in notes} <= set(workers)
    assert all(not path.startswith(driver) for note in notes for path in note["paths"])
    # the same report and answer as stages run here
    assert reports == {path.name: path.read_text() for path in (tmp_path / "cache-process" / "sensitivity").iterdir()}
    assert on_ray.verdict == local.verdict == "improved"
    assert [t.params for t in on_ray.trials] == [t.params for t in local.trials]
    assert on_ray.best.model_sha256 == local.best.model_sha256


def test_a_stage_that_times_or_names_another_of_the_engines_files_stays_here(tmp_path: Path, cluster: Any) -> None:
    from quantune.engine.executors.ray_stage import RayStages
    from quantune.engine.executors.stage import Isolation

    loaded = load_config(_config(tmp_path, "ray"))
    runner = TrialRunner(build_run(loaded).context)
    sent: list[Any] = []
    stages = RayStages(ray, {"num_cpus": 1}, None, lambda: sent.append("cargo"), runner)
    isolation = Isolation(log_dir=tmp_path)
    assert stages("speed_ceiling", str, (runner.context.model.path,), isolation) is None  # it times: the target's
    assert stages("sensitivity", str, (tmp_path / "calib.npz",), isolation) is None  # a file the nodes lack
    assert not sent  # nothing was sent to the cluster


def test_the_speed_ceilings_builds_run_as_ray_tasks_and_their_timing_on_the_target(
    tmp_path: Path, cluster: Any
) -> None:
    made, _ = cluster
    target = made.add_node(num_cpus=0, resources={"quantune_target": 1})
    try:
        config = _accuracy_config(tmp_path, "ray", spy=False)
        config["objective"] = "latency"  # the strategy starts with the speed ceilings, built ahead
        config["passes"][0]["params"] = {"per_channel": False}  # several ceilings
        config["executor"]["target"] = "quantune_target"
        result = quantune.tune(config, output=tmp_path / "out")
    finally:
        made.remove_node(target)
    text = (tmp_path / "out" / "quantune.log").read_text()
    on_nodes = re.findall(r"ceiling_build(?:_2)? stage: (\d+) of (\d+) speed ceilings built on the Ray nodes", text)
    built = sum(int(done) for done, _ in on_nodes)
    assert built >= 1 and all(done == claimed for done, claimed in on_nodes)  # every build a task on a node
    assert f"speed ceilings built ahead: {built} of {built} variants" in text  # all of them, none here
    assert not re.search(r"ceiling_build(?:_2)? stage ran on Ray node vm \(" + made.head_node.node_id[:12], text)
    assert "speed ceilings: " in text and "variants timed side by side" in text  # timed on the target
    timed = json.loads((tmp_path / "out" / "results.json").read_text())["target"]["timed"]
    assert all(target.node_id[:12] in entry["node"] for entry in timed)
    assert result.verdict in ("improved", "keep_original")
