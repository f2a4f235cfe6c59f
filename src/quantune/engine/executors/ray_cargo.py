"""What a Ray task needs to run trials on a node that shares no disk with the engine, and what
it sends back.

The model, data, scripts and the original's figures travel once through the object store; a
finished trial's model comes back into the engine's cache, the run's one source of truth, and
is timed on the target so the search never compares timings taken on unlike nodes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import tempfile
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantune._version import __version__
from quantune.config import LoadedConfig
from quantune.data import Dataset
from quantune.engine.executors.worker import WorkerSpec, runner_for
from quantune.engine.trials.ray_env import hinted, working_dir
from quantune.engine.trials.runner import TrialRunner
from quantune.engine.trials.setup import Given
from quantune.engine.trials.trial import Trial, TrialRecord
from quantune.errors import QuantuneError
from quantune.evaluate.latency import latency_figures
from quantune.model import ModelHandle
from quantune.prepare import Preparation
from quantune.store import ArtifactCache
from quantune.userlocal import local_imports

Files = dict[str, bytes]  # a path relative to the model's folder -> its content

IN_WORKING_DIR = "@working_dir/"  # a moved script's name: its place in the node's copy of the working_dir


@dataclass(frozen=True)
class Cargo:
    """The engine's files a worker needs, as data (put into Ray's object store once)."""

    model: str  # the original's file, a name in ``files["original"]``
    # "original": the user's model; "start": the prepared one (or nothing); "scripts": see _moved
    files: dict[str, Files]
    calibration: Dataset | None
    evaluation: Dataset
    preparation: Preparation  # its ``model``: a path relative to the worker's scratch folder
    metric: str  # the config's evaluation.metric and evaluation.runner, as the engine names them
    runner: str | None
    quantune: str = __version__  # the engine's: a node with another builds other models under the same keys
    evals: dict[str, dict[str, Any]] = field(default_factory=dict)  # the original's cached figures
    arrays: dict[str, dict[str, Any]] = field(default_factory=dict)  # and outputs, by cache key

    @property
    def whole(self) -> bool:
        """Whether it holds the original's outputs (packed before they were cached: not yet)."""
        return bool(self.arrays)


def _model_files(model: ModelHandle) -> Files:
    folder = model.path.parent
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in (model.path, *model.external_data)}


def _script_specs(config: Any) -> list[str]:
    """The config's specs that name a script (``path.py`` or ``path.py:function``)."""
    named = [config.evaluation.metric, config.evaluation.runner]
    named += [config.data.calibration, config.data.evaluation, *config.plugins]
    return [spec for spec in named if isinstance(spec, str) and (spec.endswith(".py") or ".py:" in spec)]


def _script_path(spec: str) -> tuple[str, str]:
    """``path.py:function`` as its path and ``:function`` (``path.py``: no function)."""
    if ".py:" not in spec:
        return spec, ""
    path, _, function = spec.rpartition(":")
    return path, f":{function}"


def _in_working_dir(loaded: LoadedConfig, path: str) -> str | None:
    """``path``'s place inside ``executor.runtime_env.working_dir`` (posix, relative), or ``None``:
    by the path the config gives, or with links followed on both sides."""
    given, real = loaded.absolute(path), os.path.realpath(loaded.absolute(path))
    for folder in working_dir(loaded.runtime_env()):
        for script in (given, real):
            if Path(script).is_relative_to(folder):
                return Path(script).relative_to(folder).as_posix()
    return None


def _moved(loaded: LoadedConfig, spec: str) -> str:
    """Where a worker finds its copy of a script: ``scripts/`` and the script's path here, relative to
    its scratch folder, so the modules of its folder sit beside it there too; a script inside the
    runtime_env's working_dir, at its place in the node's copy of that folder (:func:`on_node`), so
    every file beside it is there as well."""
    if spec not in _script_specs(loaded.config):
        return spec
    path, function = _script_path(spec)
    return f"{_node_name(loaded, path)}{function}"


def _node_name(loaded: LoadedConfig, path: str) -> str:
    inside = _in_working_dir(loaded, path)
    if inside is not None:
        return f"{IN_WORKING_DIR}{inside}"
    return f"scripts/{loaded.resolve(path).as_posix().lstrip('/')}"


def on_node(name: str) -> str:
    """A script's name from :func:`_moved` as this node finds it: a working_dir's script under the
    task's working directory (Ray's copy of that folder; only the node knows where it is)."""
    if name.startswith(IN_WORKING_DIR):
        return os.path.join(os.getcwd(), name.removeprefix(IN_WORKING_DIR))
    return name


def script_places(loaded: LoadedConfig) -> dict[str, str]:
    """Each script's file here (as it is imported: links followed) -> its :func:`_moved` name."""
    paths = [_script_path(spec)[0] for spec in _script_specs(loaded.config)]
    return {str(loaded.resolve(path)): _node_name(loaded, path) for path in paths}


def _scripts(loaded: LoadedConfig) -> Files:
    """The scripts and the modules beside them, but those inside the working_dir (Ray brings that)."""
    files: Files = {}
    for spec in _script_specs(loaded.config):
        if _in_working_dir(loaded, _script_path(spec)[0]) is not None:
            continue
        script = loaded.resolve(_script_path(spec)[0])
        for path in (script, *local_imports(script).values()):
            files[path.as_posix().lstrip("/")] = path.read_bytes()
    return files


def pack(runner: TrialRunner, loaded: LoadedConfig) -> Cargo:
    """The cargo of ``runner``'s run of ``loaded`` (the engine's side)."""
    ctx = runner.context
    start = ctx.start
    prepared = start.path != ctx.model.path
    assert ctx.preparation is not None  # (build_run always prepares, or says it did not)
    where = Path("start" if prepared else "original", start.path.name)
    key, reference_key, metric_key = ctx.baseline_keys()
    evals = {name: value for name in (key, metric_key) if (value := ctx.cache.get_json("evals", name)) is not None}
    reference = ctx.cache.get_arrays(reference_key)
    return Cargo(
        model=ctx.model.path.name,
        files={
            "original": _model_files(ctx.model),
            "start": _model_files(start) if prepared else {},
            "scripts": _scripts(loaded),
        },
        calibration=ctx.calibration,
        evaluation=ctx.evaluator.dataset,
        preparation=dataclasses.replace(ctx.preparation, model=where),
        metric=loaded.config.evaluation.metric,
        runner=loaded.config.evaluation.runner,
        evals=evals,
        arrays={} if reference is None else {reference_key: reference},
    )


def for_nodes(spec: WorkerSpec) -> WorkerSpec:
    """``spec`` without the engine's paths: no cache folder (a worker's is scratch), only the
    model's file name, scripts where the worker writes their copies (all come with the cargo)."""
    loaded = spec.loaded
    config = loaded.config
    update = {
        "cache_dir": None,
        # a worker's own timings are quick and thrown away (the engine times each model where it decides)
        "executor": config.executor.model_copy(update={"target": "driver"}),
        "model": Path(str(config.model)).name,
        **_renamed(config, lambda name: _moved(loaded, name)),
    }
    return dataclasses.replace(spec, loaded=LoadedConfig(config.model_copy(update=update), Path("."), loaded.source))


def _renamed(config: Any, rename: Callable[[str], str]) -> dict[str, Any]:
    """The config's updates that give each field naming a script ``rename``'s name for it."""
    moved = lambda name: name if name is None else rename(name)  # noqa: E731
    return {
        "plugins": [moved(plugin) for plugin in config.plugins],
        "evaluation": config.evaluation.model_copy(
            update={"metric": moved(config.evaluation.metric), "runner": moved(config.evaluation.runner)}
        ),
        "data": config.data.model_copy(
            update={"calibration": moved(config.data.calibration), "evaluation": moved(config.data.evaluation)}
        ),
    }


def node_name() -> str:
    """This machine as a trial record names it: its host name and its Ray node id."""
    import ray

    return f"{socket.gethostname()} ({ray.get_runtime_context().get_node_id()[:12]})"


def scratch_folder(node_id: str) -> Path:
    """Where the node ``node_id`` keeps what it was sent and what its trials built (its temp folder)."""
    return (Path(tempfile.gettempdir()) / f"quantune-ray-{node_id[:12]}").resolve()


def _write(folder: Path, files: Files) -> None:
    """``files`` under ``folder``, each whole (another worker of the node may write the same ones)."""
    for name, data in files.items():
        path = folder / name
        if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        tmp.write_bytes(data)
        os.replace(tmp, path)


def run_root(spec: WorkerSpec) -> Path:
    """This node's folder for the run of ``spec``: per run identity, so a later run of the same
    config on a long-lived node finds its models there."""
    import ray

    return scratch_folder(ray.get_runtime_context().get_node_id()) / spec.key[:16]


def _unpack(spec: WorkerSpec, box: list[Any]) -> tuple[LoadedConfig, Given]:
    """The worker's side: the cargo written into this node's scratch folder, the original's
    figures and outputs into its scratch cache, and the config that rebuilds the run there."""
    import ray

    cargo: Cargo = ray.get(box[0])
    if cargo.quantune != __version__:
        raise QuantuneError(
            f"Ray node {node_name()} has quantune {__version__}, the engine {cargo.quantune}: install the "
            "engine's version on every node (the same package, e.g. in the cluster's image)"
        )
    root = run_root(spec)
    for part, files in cargo.files.items():
        _write(root / part, files)
    cache = ArtifactCache(root / "cache")
    for key, value in cargo.evals.items():
        cache.put_json("evals", key, value)
    for key, arrays in cargo.arrays.items():
        cache.put_arrays(key, arrays)
    config = spec.loaded.config
    update = {"model": str(root / "original" / cargo.model), "cache_dir": str(cache.root), **_renamed(config, on_node)}
    config = config.model_copy(update=update)
    preparation = dataclasses.replace(cargo.preparation, model=root / cargo.preparation.model)
    given = Given(cargo.calibration, cargo.evaluation, preparation, cargo.metric, cargo.runner)
    return LoadedConfig(config, root, spec.loaded.source), given  # the scripts' copies are under root (or cwd)


def node_runner(spec: WorkerSpec, box: list[Any]) -> TrialRunner:
    """The run rebuilt on this node from the cargo in ``box`` (once per worker process)."""
    runner = runner_for(spec, lambda: _unpack(spec, box))
    runner.context.evaluator.quick_timing = True  # the engine times every model again, where it decides
    return runner


def run_shipped(spec: WorkerSpec, box: list[Any], trial: Trial) -> Iterator[dict[str, Any] | None]:
    """A Ray task's body (a streaming generator): ``None`` once the run is built and the trial starts
    (the trial's clock starts there, not while the task waited), then the record and the model's files."""
    runner = node_runner(spec, box)
    yield None
    record = runner.run(trial)
    returned: dict[str, Any] = {"record": record.to_dict(), "node": node_name()}
    entry = Path(record.model_path).parent if record.model_path else None
    if record.status == "ok" and entry is not None and entry.parent == runner.context.cache.root / "models":
        files = [path for path in entry.rglob("*") if path.is_file()]
        returned["key"] = entry.name
        returned["files"] = {path.relative_to(entry).as_posix(): path.read_bytes() for path in files}
    yield returned


def entries(cache: ArtifactCache, than: Collection[str] = ()) -> dict[str, Files]:
    """The files of each model entry of ``cache`` (by key) not in ``than``: what a node built, to send back."""
    models = cache.root / "models"
    found = [entry for entry in models.iterdir() if entry.name not in than] if models.is_dir() else []
    return {e.name: {p.relative_to(e).as_posix(): p.read_bytes() for p in e.rglob("*") if p.is_file()} for e in found}


def put_entry(cache: ArtifactCache, key: str, files: Files) -> tuple[Path, str]:
    """A node's model entry (:func:`entries`) put into ``cache`` under ``key``: its path and hash."""
    meta = json.loads(files.pop("meta.json", b"{}"))
    meta.pop("sha256", None)
    work = cache.new_work_dir()
    _write(work, files)
    return cache.put_model(key, work, meta)


def receive(runner: TrialRunner, returned: dict[str, Any]) -> TrialRecord:
    """The engine's side: the trial's model put into the engine's cache (the record names that
    copy), timed here, and its figures cached here as a local trial's would be."""
    ctx = runner.context
    record = TrialRecord.from_dict(returned["record"])
    record.nodes = {"built": returned["node"]}
    if record.status != "ok":
        record.error = hinted(record.error)
        return record
    files: Files | None = returned.get("files")
    if files is None:  # no pass changed the model: the one trials start from, or the original
        known = {ctx.start.sha256: ctx.start.path, ctx.model.sha256: ctx.model.path}
        if record.model_sha256 not in known:
            raise ValueError(f"the Ray worker's model (sha256 {record.model_sha256}) is not one this run knows")
        path = known[record.model_sha256]
    else:
        path, sha = put_entry(ctx.cache, returned["key"], files)
        if sha != record.model_sha256:
            raise ValueError(f"the model the Ray worker sent (sha256 {sha}) is not the one it built")
    record.model_path = str(path)
    timings = ctx.evaluator.timings_side_by_side([path])
    record.metrics.update(latency_figures(timings[0]))
    record.nodes["timed"] = ctx.evaluator.backend.describe().get("timed_on") or node_name()
    ctx.cache.put_json("evals", ctx.eval_key(record.model_sha256), {"metrics": record.metrics})
    return record
