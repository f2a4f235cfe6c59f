"""Stages whose answer rests on no timing, as Ray tasks on any node, when the run's executor is Ray.

A stage that only builds and evaluates (the sensitivity analysis: the flow's passes, then both
models over calibration data) gives the same answer on any node, so it goes where the trials go:
a task with the trials' resources (CPUs, GPUs, custom resources), fed by the trials' cargo
(ray_cargo.py: the model, data and scripts through the object store, the node's scratch folder
for its cache), and more nodes leave the engine's machine free for the timing. Each such stage's
node is written to the run's log.

The builds ahead of the speed ceilings go too, one task per model, each model put back into the
engine's cache, where the ceilings' timing looks for it. What must stay sequential, on the target:
every stage that times (the speed ceilings, the node profile, paired latencies, the original's
evaluation) runs in a local worker as without Ray, one timing at a time where the run decides.
A stage whose job names a file of the engine's other than the run's model and cache runs locally too.
"""

from __future__ import annotations

import io
import logging
import pickle
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Any

from quantune.engine.executors import stage as stages
from quantune.engine.executors.ray_cargo import entries, node_name, node_runner, on_node, put_entry, run_root
from quantune.engine.executors.stage import Isolation, StageOutcome
from quantune.engine.executors.worker import WorkerSpec
from quantune.engine.trials.ray_env import hinted
from quantune.engine.trials.runner import TrialRunner
from quantune.memory import peak_tracker, take_stage_peaks

log = logging.getLogger("quantune.ray")

# the stages whose answer rests on no timing (run_stage's names): the ones sent to the cluster
REMOTE_STAGES = frozenset({"sensitivity"})
# the builds ahead of the speed ceilings (engine/measure/prebuild.py's stages): one task per model
CEILING_BUILDS = "ceiling_build"

_POLL_S = 0.05  # how often a waiting stage looks at the run's deadline and its time limit

# modules import_script makes of the user's scripts (named by the script's path, which differs on a node)
_USER_MODULE = "quantune_user_"


class _Foreign(Exception):
    """The job names a file only the engine's machine has."""


def _places(runner: TrialRunner) -> dict[str, Path]:
    ctx = runner.context
    return {"model": ctx.model.path, "start": ctx.start.path, "cache": ctx.cache.root}


class _Packer(pickle.Pickler):
    """Pickles a stage's job for a node: the run's model and cache paths as places the node has
    too, and classes from the user's scripts (plugin passes and their configs) by script and name."""

    def __init__(self, file: io.BytesIO, places: dict[str, Path], scripts: dict[str, str] | None = None) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.places = places
        self.scripts = scripts or {}  # a script's file here -> its name on a node (ray_cargo.script_places)

    def persistent_id(self, obj: Any) -> tuple[str, ...] | None:
        if isinstance(obj, PurePath):
            path = Path(obj)
            for place, where in self.places.items():
                if path == where:
                    return ("path", place, "")
                if place == "cache" and path.is_relative_to(where):
                    return ("path", place, path.relative_to(where).as_posix())
            raise _Foreign(str(obj))
        if isinstance(obj, type) and obj.__module__.startswith(_USER_MODULE):
            file = str(sys.modules[obj.__module__].__file__)
            return ("class", self.scripts.get(file, f"scripts/{file.lstrip('/')}"), obj.__qualname__)
        return None


class _Unpacker(pickle.Unpickler):
    """The node's side of :class:`_Packer`: places as this node's copies, classes from its scripts' copies."""

    def __init__(self, file: io.BytesIO, places: dict[str, Path], root: Path) -> None:
        super().__init__(file)
        self.places, self.root = places, root

    def persistent_load(self, pid: tuple[str, ...]) -> Any:
        if pid[0] == "path":
            _, place, relative = pid
            return self.places[place] / relative if relative else self.places[place]
        from quantune.userimport import import_script

        _, script, qualname = pid
        module = import_script(on_node(script), "plugins", self.root)  # (already imported)
        target: Any = module
        for part in qualname.split("."):
            target = getattr(target, part)
        return target


def build_shipped(spec: WorkerSpec, box: list[Any], build: Callable[..., Any], item: Any) -> dict[str, Any]:
    """A Ray task's body: one speed ceiling's model built on this node (``build``: the builds
    stage's function), and every model entry the build made, for the engine's cache."""
    cache = node_runner(spec, box).context.cache
    before = set(entries(cache))
    build(spec, [item], None, False)
    return {"node": node_name(), "entries": entries(cache, before)}


def run_stage_shipped(spec: WorkerSpec, box: list[Any], stage: str, job: bytes) -> dict[str, Any]:
    """A Ray task's body: the run rebuilt on this node (as a trial's task does), ``job`` (the
    stage's function and arguments) unpickled against it, and the stage's answer."""
    runner = node_runner(spec, box)
    fn, args = _Unpacker(io.BytesIO(job), _places(runner), run_root(spec)).load()
    take_stage_peaks()
    value, error, tail = None, None, ""
    with peak_tracker() as peak:
        try:
            value = fn(*args)
        except Exception as exc:
            error, tail = f"{type(exc).__name__}: {exc}", "\n".join(traceback.format_exc().splitlines()[-20:])
    returned = {"value": value, "error": error, "tail": tail, "peak": peak.mb, "peaks": take_stage_peaks()}
    return {**returned, "node": node_name()}


class RayStages:
    """The :data:`REMOTE_STAGES` of a Ray run as tasks; called by ``stage.run_stage`` (its ``remote``)."""

    def __init__(
        self,
        ray: Any,
        options: dict[str, Any],
        spec: Any,
        cargo: Callable[[], Any],
        runner: TrialRunner,
        scripts: dict[str, str] | None = None,
    ) -> None:
        """``options``: the trials' (resources, retries, runtime_env); ``scripts``: where a node finds
        each of the user's scripts (ray_cargo.script_places), for the classes a job names."""
        self._ray = ray
        self._remote = ray.remote(run_stage_shipped).options(**options)
        self._build = ray.remote(build_shipped).options(**options)
        self._spec, self._cargo, self._runner, self._scripts = spec, cargo, runner, scripts

    def __call__(self, stage: str, fn: Callable[..., Any], args: tuple, isolation: Isolation) -> StageOutcome | None:
        """The stage's outcome from a node, or ``None`` when it is to run here (it times, or
        its job names one of the engine's files)."""
        if stage.startswith(CEILING_BUILDS):
            return self._builds(stage, fn, args, isolation)
        if stage not in REMOTE_STAGES:
            return None
        buffer = io.BytesIO()
        try:
            _Packer(buffer, _places(self._runner), self._scripts).dump((fn, args))
        except _Foreign as exc:
            log.info("%s stage runs on this machine: its job names %s, a file the nodes do not have", stage, exc)
            return None
        except Exception as exc:  # (a local worker would say why, if it cannot take the job either)
            log.info("%s stage runs on this machine: its job does not pickle for a node (%s)", stage, exc)
            return None
        if isolation.deadline.left_s() == 0.0:
            return StageOutcome(error=f"not started: {isolation.deadline.reason}", unneeded=isolation.deadline.unneeded)
        task = self._remote.remote(self._spec, [self._cargo()], stage, buffer.getvalue())
        return self._follow(stage, task, isolation)

    def _builds(self, stage: str, fn: Callable[..., Any], args: tuple, isolation: Isolation) -> StageOutcome:
        """The builds this stage claims (all it can), each a task on any node, their models put into
        the engine's cache, where the ceilings' timing finds them; the original's node profile, which
        times, then in a local worker of its own (``node_profile``)."""
        spec, items, _, profile, queue = args
        claimed = [index for index in queue.order() if queue.claim(index)]  # (a node's calibration is its own)
        box = [self._cargo()]
        tasks = [self._build.remote(self._spec, box, fn, items[index]) for index in claimed]
        built = 0
        for task in tasks:
            outcome = self._follow(stage, task, isolation)
            for key, files in (outcome.value or {}).items():
                put_entry(self._runner.context.cache, key, files)
            built += outcome.ok
        log.info("%s stage: %d of %d speed ceilings built on the Ray nodes", stage, built, len(claimed))
        if profile:
            stages.run_stage("node_profile", fn, spec, [], None, True, isolation=isolation)
        return StageOutcome(built)

    def _follow(self, stage: str, task: Any, isolation: Isolation) -> StageOutcome:
        """Waits for ``task`` as a local stage waits for its worker: the run's deadline and the
        trials' time limit cancel it."""
        ray = self._ray
        limit = None if isolation.timeout_s is None else time.monotonic() + isolation.timeout_s
        cancelled: str | None = None
        unneeded = False
        while not ray.wait([task], timeout=_POLL_S)[0]:
            if isolation.deadline.left_s() == 0.0:
                cancelled, unneeded = isolation.deadline.reason, isolation.deadline.unneeded
            elif limit is not None and time.monotonic() >= limit:
                cancelled = f"timeout: the stage ran longer than {isolation.timeout_s:g} s and was cancelled"
            if cancelled is not None:
                ray.cancel(task, force=True)
                return StageOutcome(error=cancelled, unneeded=unneeded)
        try:
            returned = ray.get(task)
        except ray.exceptions.WorkerCrashedError as exc:
            return StageOutcome(error=f"worker crashed: {exc}")
        except Exception as exc:
            cause = getattr(exc, "cause", None) or exc  # what the task raised, without Ray's wrapping
            return StageOutcome(error=hinted(f"ray task failed: {type(cause).__name__}: {cause}"))
        log.info("%s stage ran on Ray node %s", stage, returned["node"])
        if "entries" in returned:
            return StageOutcome(returned["entries"])
        error = hinted(returned["error"])
        return StageOutcome(returned["value"], error, returned["peak"], returned["tail"], returned["peaks"])


def send_stages(to: RayStages | None) -> None:
    """Routes the :data:`REMOTE_STAGES` of this process's runs to ``to`` (``None``: back here)."""
    stages.remote = to
