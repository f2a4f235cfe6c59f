"""quantune on a multi-node Ray cluster simulated on this machine (run: python bench/cluster.py).

A ``ray.cluster_utils.Cluster``: a head that runs nothing (0 CPUs) and three worker nodes of one
CPU each, one of them holding the ``quantune_target`` resource (``executor.target``: every timing
that decides anything runs there). No path is shared by configuration: each node writes what it
is sent into a scratch folder of its own, and the engine's cache stays the one source of truth.
For each model (by default the bundled digits example, and the scaled CNN with its refining flows,
which makes the accuracy-driven strategy run sensitivity and recovery; ``--models`` adds built zoo
models by name, e.g. ``--models digits,scaled_cnn,ppocrv6_det``, each with an ``executor.runtime_env``
for the files its scripts reach by path, see :func:`zoo_env`): a local run (process workers)
and a cluster run, both with ``search.strategy: quantune`` and fresh caches; their verdicts and
best models compared, their wall times side by side; then a cluster run on digits where a worker
node is removed once it has started work. Ray's start-up is outside the clock (a cluster is up
before a run). The nodes share this machine's cores, so the wall times are illustrative only.

A scale-on-paper table follows: from the last model's cluster run's measured stage times (results.json's
``time_spent_s``), what 8, 32 and 128 nodes would do for a model whose evaluation takes ten
minutes -- which stages are sequential, which run on the nodes, and which parallelise over them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
# and for the processes it starts (Ray's workers, stage workers), which do not see sys.path
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))

import quantune  # noqa: E402
from quantune.engine.executors.ray_cargo import scratch_folder  # noqa: E402

MODELS = {"digits": ROOT / "examples/digits/config.yaml", "scaled_cnn": ROOT / "examples/scaled_cnn/finetune.yaml"}
ZOO = Path.home() / ".cache" / "quantune-zoo"  # a built zoo model's folder holds its zoo-run.yaml (bench/zoo)
TARGET = "quantune_target"
EVALUATION_S = 600.0  # the paper model's one evaluation over its validation set
NODES = (1, 8, 32, 128)
JOINT_TRIALS = 128  # a sampler-driven search (search.strategy: joint) of this many trials, for comparison
# what the zoo's metrics and loaders import from bench/zoo/ by path (and what those import)
SHARED_ZOO_MODULES = ("agreement", "detections", "photos", "zoolib")
ZOO_EXCLUDES = ["calib*.npz", "eval*.npz", "zoo-run.yaml", ".built"]  # the data travels as the loaders returned it


def model_path(name: str) -> Path:
    """An example's config, or a built zoo model's (``--models ppocrv6_det``)."""
    return MODELS.get(name, ZOO / name / "zoo-run.yaml")


def zoo_env(name: str) -> dict[str, Any] | None:
    """A zoo model's ``executor.runtime_env`` (None for an example): its scripts reach files by path --
    the model beside the metric (``__file__``), the shared zoo modules through their parent folder on
    ``sys.path`` -- which reach the nodes only this way. Its cache folder is the working_dir (the
    scripts there are links into bench/zoo/<name>/: Ray packs what they point to) without the data the
    run ships anyway; the shared modules go on every node's path."""
    if name in MODELS:
        return None
    shared = [str(ROOT / "bench" / "zoo" / f"{module}.py") for module in SHARED_ZOO_MODULES]
    return {"working_dir": str(ZOO / name), "excludes": ZOO_EXCLUDES, "py_modules": shared}


def config_of(path: Path, cache: Path, executor: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """The config (its paths stay relative to its folder) and the overrides: the accuracy-driven strategy,
    its own cache, the executor."""
    return path, {"search.strategy": "quantune", "cache_dir": str(cache), "executor": executor}


def tune(config: tuple[Path, dict[str, Any]], output: Path) -> dict[str, Any]:
    started = time.perf_counter()
    result = quantune.tune(config[0], output=output, overrides=config[1])
    wall = time.perf_counter() - started
    saved = json.loads((output / "results.json").read_text())
    timed_on = {entry["node"] for entry in saved.get("target", {}).get("timed", [])}
    return {
        "wall_s": round(wall, 2),
        "verdict": result.verdict,
        "best_sha256": result.best.model_sha256 if result.best else None,
        "best_params": result.best.params if result.best else None,
        "trials": len(result.trials),
        "failed": sum(t.status != "ok" for t in result.trials),
        "numbers": sorted(t.number for t in result.trials),
        "built_on": sorted({(t.nodes or {}).get("built", "engine") for t in result.trials}),
        "timed_on": sorted(timed_on),
        "stages_s": saved["time_spent_s"],
        "stage_errors": [f"{error['stage']}: {error['error']}" for error in saved.get("stage_errors", [])],
        "trial_stages": [t.stage.split(":")[0] if t.stage else "" for t in result.trials],
        # the stages sent to the nodes (engine/executors/ray_stage.py), as the run's log names them
        "stages_on": dict(
            re.findall(r"(\w+) stage ran on Ray node .* \((\w+)\)", (output / "quantune.log").read_text())
        ),
    }


def remove_a_working_node(made: Any, workers: list[Any], done: threading.Event, removed: list[str]) -> None:
    """Once a non-target worker node has received work (its scratch folder appears), it goes."""
    spare = workers[1:]  # (the first holds the target)
    while not done.wait(0.05):
        for node in spare:
            if scratch_folder(node.node_id).exists():
                made.remove_node(node, allow_graceful=False)
                removed.append(node.node_id)
                return


def paper(run: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
    """Hours a run like ``run`` would take on n nodes when one evaluation takes EVALUATION_S.

    The measured "original" stage is one evaluation (its time, e, sets the scale E/e). On the
    engine's machine (or the target lane), whatever the nodes: the original's evaluation (E), the
    speed ceilings and the confirmation (timings, not evaluation-bound: as measured). On a node:
    sensitivity (measured x E/e: the passes and both models over calibration data), one Ray task
    the strategy waits for, so one wave whatever the nodes. Parallel: each trial phase's trials run
    as Ray tasks, one evaluation each, ceil(trials / n) waves, and the phases follow one another
    (each asks from what the last one told)."""
    stages = run["stages_s"]
    scale = EVALUATION_S / max(stages.get("original", 0.0), 1e-3)
    phases: dict[str, int] = {}
    for stage in run["trial_stages"]:
        phases[stage] = phases.get(stage, 0) + 1
    on_engine = EVALUATION_S + sum(stages.get(name, 0.0) for name in ("set-up", "ceilings", "confirmation", "writing"))
    on_a_node = stages.get("sensitivity", 0.0) * scale
    rows = []
    for nodes in NODES:
        waves = sum(math.ceil(count / nodes) for count in phases.values())
        total = on_engine + on_a_node + waves * EVALUATION_S
        joint = EVALUATION_S * (1 + math.ceil(JOINT_TRIALS / nodes))  # the original, then the trials' waves
        rows.append(
            {
                "nodes": nodes,
                "trial_waves": waves,
                "engine_hours": round(on_engine / 3600, 2),
                "sensitivity_hours": round(on_a_node / 3600, 2),
                "hours": round(total / 3600, 2),
                "joint_hours": round(joint / 3600, 2),
            }
        )
    return rows, scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--models", default="digits,scaled_cnn", help="examples or built zoo models, comma-separated")
    args = parser.parse_args()
    names = args.models.split(",")
    for name in names:
        if not model_path(name).is_file():
            parser.error(f"--models: {name} is neither an example ({', '.join(MODELS)}) nor a built zoo model in {ZOO}")
    import ray
    from ray import cluster_utils

    folder = Path(tempfile.mkdtemp(prefix="quantune-cluster-bench-"))
    rows: dict[str, Any] = {}
    for name, path in ((name, model_path(name)) for name in names):  # local first: Ray is not running yet
        local = {"kind": "process", "workers": 2}
        rows[f"{name} local"] = tune(config_of(path, folder / f"{name}-local", local), folder / f"{name}-local-out")
        print(name, "local", rows[f"{name} local"]["wall_s"], flush=True)

    made = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    workers = [made.add_node(num_cpus=1, resources={TARGET: 1})] + [made.add_node(num_cpus=1) for _ in range(2)]
    ray.init(address=made.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    on_ray = {"kind": "ray", "workers": 3, "target": TARGET}
    try:
        for name, path in ((name, model_path(name)) for name in names):
            key = f"{name} cluster"
            env = zoo_env(name)
            executor = on_ray if env is None else {**on_ray, "runtime_env": env}
            rows[key] = tune(config_of(path, folder / f"{name}-ray", executor), folder / f"{name}-ray-out")
            print(name, "cluster", rows[key]["wall_s"], flush=True)
        done, removed = threading.Event(), []
        for node in workers:  # fresh scratch: the remover watches for a node's first work
            shutil.rmtree(scratch_folder(node.node_id), ignore_errors=True)
        remover = threading.Thread(target=remove_a_working_node, args=(made, workers, done, removed))
        remover.start()
        try:
            run = tune(config_of(MODELS["digits"], folder / "removed", on_ray), folder / "removed-out")
        finally:
            done.set()
            remover.join()
        run["removed_node"] = removed[0][:12] if removed else None
        rows["digits cluster, a node removed"] = run
    finally:
        nodes = [node["NodeID"] for node in ray.nodes()]
        ray.shutdown()
        made.shutdown()
        for node in nodes:
            shutil.rmtree(scratch_folder(node), ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)

    for name in names:
        local, cluster = rows[f"{name} local"], rows[f"{name} cluster"]
        cluster["same_as_local"] = (cluster["verdict"], cluster["best_sha256"]) == (
            local["verdict"],
            local["best_sha256"],
        )
    table, scale = paper(rows[f"{names[-1]} cluster"])
    write(rows, table, scale, Path(args.out), names[-1])


def write(rows: dict[str, Any], table: list[dict[str, Any]], scale: float, out: Path, paper_model: str) -> None:
    lines = [
        "# quantune on a simulated Ray cluster (bench/cluster.py)",
        "",
        f"Command: `python bench/cluster.py --models {','.join(name.split(' ')[0] for name in rows if name.endswith(' local'))}`. A head (0 CPUs) and three worker nodes of 1 CPU each, one "
        f"holding `{TARGET}` (`executor.target`: every decision timing there); `search.strategy: quantune`; "
        "fresh caches. **The nodes share this machine's 2 cores (shared with other work): wall times are "
        "illustrative, not a speed-up measurement.**",
        "",
        "| run | wall s | verdict | best (flow) | best model = local's | trials (failed) | built on | timed on "
        "| stages on nodes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        same = row.get("same_as_local", "")
        built = ", ".join(node.split(" ")[-1] for node in row["built_on"])
        timed = ", ".join(node.split(" ")[-1] for node in row["timed_on"]) or "engine"
        extra = f" (removed: {row['removed_node']})" if "removed_node" in row else ""
        stages = ", ".join(f"{stage} ({node})" for stage, node in row["stages_on"].items()) or "none"
        lines.append(
            f"| {name}{extra} | {row['wall_s']} | {row['verdict']} | {(row['best_params'] or {}).get('flow')} "
            f"| {same} | {row['trials']} ({row['failed']}) "
            f"| {built} | {timed} | {stages} |"
        )
    cluster = rows[f"{paper_model} cluster"]["stages_s"]
    lines += [
        "",
        "The accuracy-driven strategy's choices follow timings (which flow's speed ceiling is fastest, "
        "which recovery is faster): on a shared machine two runs, local or not, can pick different models "
        "of the same verdict. The removed node's trial is retried elsewhere (Ray's retry: one record, none failed).",
        "",
        f"Stage times of {paper_model}'s cluster run (s): " + ", ".join(f"{k} {v:g}" for k, v in cluster.items() if v),
        "",
        f"## On paper: one evaluation takes {EVALUATION_S / 60:g} minutes (x{scale:.0f} the measured original stage)",
        "",
        "On the engine's machine (or the target lane) whatever the nodes: the original's evaluation, the speed "
        "ceilings and the confirmation (timings). On a node: sensitivity, one Ray task the strategy waits for "
        "(one wave whatever the nodes). Parallel: each trial phase's trials (first guess, op-type and bisection "
        "trials, recovery fits), one evaluation each, in ceil(trials / nodes) waves; the phases follow one another.",
        "",
        f"| nodes | trial waves | engine h | sensitivity h (a node) | hours (this run's strategy) "
        f"| hours (a joint search of {JOINT_TRIALS} trials) |",
        "|---|---|---|---|---|---|",
        *[
            f"| {row['nodes']} | {row['trial_waves']} | {row['engine_hours']} | {row['sensitivity_hours']} "
            f"| {row['hours']} | {row['joint_hours']} |"
            for row in table
        ],
        "",
        "The accuracy-driven strategy asks few trials per phase, so nodes past that number idle. Its "
        "sensitivity now runs on a node, off the engine's machine, but as one task: more nodes shorten it "
        "only once it is split per unit. The ceilings' builds ahead run on the nodes too, one Ray task a "
        "model; their timing stays on the target lane. A sampler-driven search parallelises its trials up to "
        "the number of trials.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d-%H%M")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"cluster-{stamp}.md").write_text(text)
    (out / f"cluster-{stamp}.json").write_text(json.dumps({"runs": rows, "paper": table, "scale": scale}, indent=1))


if __name__ == "__main__":
    main()
