"""Timings on the Ray nodes the user names as the target (``executor.target``).

Timings taken on unlike nodes compare machines, not models, so every deciding timing runs in a
named Ray actor holding a target node's resource whole (that node's lane, one timing at a time),
all its models on that node; accuracy, memory and session opens stay where they run. Target
nodes that differ in versions or CPU flags are refused; a lost lane's timings go to the others.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from quantune._version import __version__
from quantune.errors import QuantuneError
from quantune.evaluate.backend import LocalBackend
from quantune.evaluate.latency import TimingRequest
from quantune.evaluate.session_file import session_file
from quantune.machine import cpu_flags
from quantune.model import external_data_files

DRIVER = "driver"  # executor.target's default: time on the machine running quantune
NAMESPACE = "quantune"
# how stage processes find the engine's cluster (not RAY_ADDRESS: a later local Ray would join a dead one)
ADDRESS_VARIABLE = "QUANTUNE_RAY_ADDRESS"

Files = dict[str, bytes]


class TimingLane:
    """The actor's body, on a target node: the node's models by key, timed by a local backend."""

    def __init__(self, provider: str, provider_options: dict[str, str]) -> None:
        import ray

        self._backend = LocalBackend(provider, provider_options)
        node = ray.get_runtime_context().get_node_id()
        self._folder = Path(tempfile.gettempdir()) / f"quantune-ray-{node[:12]}" / "target"
        self.node = f"{os.uname().nodename} ({node[:12]})"
        self.log: list[dict[str, Any]] = []  # every timing this lane took, whichever process asked

    def timed(self) -> list[dict[str, Any]]:
        return self.log

    def identity(self) -> dict[str, Any]:
        """What makes two nodes' timings comparable, and what results.json says of the target."""
        return {**self._backend.describe(), "quantune": __version__, "cpu_flags": cpu_flags(), "node": self.node}

    def missing(self, keys: list[str]) -> list[str]:
        return [key for key in keys if not (self._folder / key / "done").is_file()]

    def receive(self, key: str, files: Files) -> None:
        folder = self._folder / key
        for name, data in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)
        (folder / "done").write_text("")

    def time(self, request: TimingRequest, models: list[tuple[str, str]], labels: list[str]) -> np.ndarray:
        """``LocalBackend.time`` of ``request`` on this node's copies of ``models`` (each a (key, name));
        its ``deadline``/``limit`` come as seconds left (clocks differ by node)."""
        now = time.perf_counter()
        placed = tuple(self._folder / key / name for key, name in models)
        request = replace(request, models=placed, **_shifted(request, now))
        timings = self._backend.time(request)
        self.log.append({"models": labels, "node": self.node, "at": time.time()})
        return timings


class RayTargetBackend:
    """``local``'s evaluations where this process runs; its timings on the nodes holding ``resource``,
    one lane per node: each timing wholly on one node, its ratios within it, and the nodes alike."""

    def __init__(self, local: LocalBackend, resource: str, address: str | None = None) -> None:
        import ray

        self._local = local
        self.provider = local.provider
        self.resource = resource
        self.timed: list[dict[str, Any]] = []  # each timing this process asked for: what, on which node
        self._lanes: dict[str, Any] = {}  # node -> its lane, in the nodes' order
        self._uses: dict[str, int] = {}  # timings each lane took for this process: the next goes to the least used
        self._busy: set[str] = set()
        self._identity: dict[str, Any] = {}  # the first lane's: every other lane times alike
        self._sent: set[tuple[str, str]] = set()  # (node, model key) each lane holds
        self._turn = threading.Condition()
        self._here = threading.local()  # the node of this thread's last timing
        if ray.is_initialized():  # the engine's stage processes join the cluster this process is on,
            os.environ[ADDRESS_VARIABLE] = ray.get_runtime_context().gcs_address
            self._open_lanes()  # and find this process's lanes, which live as long as the run
        elif address:
            os.environ[ADDRESS_VARIABLE] = address

    # -- evaluations here -----------------------------------------------------------------
    def check(self) -> None:
        self._local.check()

    def outputs(self, *args: Any, **kwargs: Any) -> Any:
        return self._local.outputs(*args, **kwargs)

    def peak_memory_mb(self, *args: Any, **kwargs: Any) -> float:
        return self._local.peak_memory_mb(*args, **kwargs)

    def open_s(self, *args: Any, **kwargs: Any) -> float:
        return self._local.open_s(*args, **kwargs)

    def launch_memory_probe(self) -> None:
        self._local.launch_memory_probe()

    def fingerprint(self) -> dict[str, Any]:
        """The local one's, with the target named: figures cached for another target never stand in."""
        return {**self._local.fingerprint(), "timed_on": f"ray:{self.resource}"}

    def describe(self) -> dict[str, Any]:
        """The local one's, with the lanes' nodes, every timing they took in time order (a lost
        lane's as this process saw them), and ``timed_on``: the node of this thread's last timing."""
        import ray

        timed = []
        for lane in list(self._lanes.values()):
            with contextlib.suppress(ray.exceptions.RayActorError):
                timed += ray.get(lane.timed.remote())
        answered = {entry["node"] for entry in timed}
        timed = sorted(timed + [e for e in self.timed if e["node"] not in answered], key=lambda e: e["at"])
        on = {"resource": self.resource, **self._identity, "nodes": list(self._lanes)}
        timed_on = getattr(self._here, "node", None) or ", ".join(self._lanes)
        return {**self._local.describe(), "timings_on": on, "timed": timed, "timed_on": timed_on}

    # -- timings there --------------------------------------------------------------------
    def time(self, request: TimingRequest) -> np.ndarray:
        """``request`` timed by one lane, the least used free one (another if that one is lost)."""
        import ray

        request = replace(request, **_shifted(request, -time.perf_counter()))  # seconds left
        labels = [str(model) for model in request.models]
        node, lane = self._take()
        try:
            timings = self._ask(node, lane, request, labels)
        except ray.exceptions.RayActorError:  # the lane's node was lost: another target node's lane
            self._give(node, lost=True)
            node, lane = self._take()
            timings = self._ask(node, lane, request, labels)
        finally:  # (the lane that answered, or failed last)
            self._give(node)
        self._here.node = node
        self.timed.append({"models": labels, "node": node, "at": time.time()})
        return timings

    def _take(self) -> tuple[str, Any]:
        """A free lane (waiting for one while every lane times for this process), marked busy."""
        with self._turn:
            while True:
                if not self._lanes:
                    self._open_lanes()
                free = [node for node in self._lanes if node not in self._busy]
                if free:
                    node = min(free, key=lambda name: self._uses[name])
                    self._busy.add(node)
                    self._uses[node] += 1
                    return node, self._lanes[node]
                self._turn.wait()

    def _give(self, node: str, lost: bool = False) -> None:
        with self._turn:
            self._busy.discard(node)
            if lost:
                self._lanes.pop(node, None)
                self._sent = {sent for sent in self._sent if sent[0] != node}
            self._turn.notify_all()

    def _ask(self, node: str, lane: Any, request: TimingRequest, labels: list[str]) -> np.ndarray:
        import ray

        placed = [self._ship(node, lane, model) for model in request.models]
        return ray.get(lane.time.remote(replace(request, models=()), placed, labels))

    def _ship(self, node: str, lane: Any, value: Path) -> tuple[str, str]:
        """``value``'s place on the lane's node, its files sent there first if the lane lacks them."""
        import ray

        path = Path(value)
        stat = path.stat()
        key = hashlib.sha256(repr((str(path), stat.st_size, stat.st_mtime_ns)).encode()).hexdigest()[:24]
        if (node, key) not in self._sent and ray.get(lane.missing.remote([key])):
            files = [path, *external_data_files(path)]
            if session_file(path).is_file():
                files.append(session_file(path))
            lane_files = {f.relative_to(path.parent).as_posix(): f.read_bytes() for f in files}
            ray.get(lane.receive.remote(key, lane_files))
        self._sent.add((node, key))
        return (key, path.name)

    def _open_lanes(self) -> None:
        import ray

        if not ray.is_initialized():  # a stage process of the engine: the driver's cluster
            address = os.environ.get(ADDRESS_VARIABLE)
            if not address:
                raise QuantuneError(
                    f"executor.target: '{self.resource}' is a resource of a running Ray cluster: give its "
                    "executor.address (or connect with ray.init before tuning)"
                )
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        like = self._identity or None  # later lanes must time as the first did
        lanes, self._identity = open_lanes(self.resource, self.provider, self._local.provider_options, like)
        self._lanes = {identity["node"]: lane for lane, identity in lanes}
        self._uses = {node: self._uses.get(node, 0) for node in self._lanes}


def _shifted(request: TimingRequest, by: float) -> dict[str, float]:
    """``request``'s ``deadline`` and ``limit`` moved by ``by`` seconds (to seconds left and back)."""
    return {name: value + by for name in ("deadline", "limit") if (value := getattr(request, name)) is not None}


def target_nodes(resource: str) -> list[dict[str, Any]]:
    """The live nodes holding ``resource``, in a stable order."""
    import ray

    held = [node for node in ray.nodes() if node.get("Alive") and node.get("Resources", {}).get(resource, 0) > 0]
    return sorted(held, key=lambda node: node["NodeID"])


def check_target(resource: str) -> None:
    """One line naming ``executor.target`` when no node of the cluster holds ``resource``."""
    import ray

    if not target_nodes(resource):
        named = sorted({name for name in ray.cluster_resources() if not name.startswith("node:")})
        raise QuantuneError(
            f"executor.target: no node of the Ray cluster holds the resource '{resource}' (it has {named}); "
            f"start the target machines with --resources='{{\"{resource}\": 1}}', or set executor.target: driver"
        )


COMPARED = ("quantune", "onnxruntime", "cpu_flags")  # what makes two nodes' timings comparable


def open_lanes(
    resource: str, provider: str, options: dict[str, str], like: dict[str, Any] | None = None
) -> tuple[list[tuple[Any, dict[str, Any]]], dict[str, Any]]:
    """A lane actor on each target node, with its identity, and the identity they share: the first
    node's, or ``like`` (lanes replacing lost ones: a node unlike it never times). Unlike nodes at
    the start are refused: their figures would compare machines, not models."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    check_target(resource)
    settings = hashlib.sha256(repr((provider, sorted(options.items()))).encode()).hexdigest()[:8]
    lanes = []
    for node in target_nodes(resource):
        actor = (
            ray.remote(TimingLane)
            .options(
                name=f"quantune-lane-{resource}-{node['NodeID'][:12]}-{settings}",
                namespace=NAMESPACE,
                get_if_exists=True,
                num_cpus=0,
                resources={resource: node["Resources"][resource]},  # the whole node's: nothing else times there
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
            )
            .remote(provider, options)
        )
        lanes.append((actor, ray.get(actor.identity.remote())))
    reference = like or lanes[0][1]
    alike = []
    for actor, identity in lanes:
        differ = ", ".join(k for k in COMPARED if identity[k] != reference[k])
        if differ and like is None:
            raise QuantuneError(
                f"executor.target: the nodes holding '{resource}' differ in {differ} ({reference['node']} and "
                f"{identity['node']}): their timings would not compare; give '{resource}' to alike machines only"
            )
        if differ:
            ray.kill(actor)  # it may build and evaluate; it never times
        else:
            alike.append((actor, identity))
    if not alike:
        raise QuantuneError(
            f"executor.target: no live node holding '{resource}' has the quantune, onnxruntime and CPU flags of "
            "the node that timed the run so far: its timings would not compare"
        )
    return alike, reference
