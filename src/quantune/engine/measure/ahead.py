"""The stage workers' side of the builds ahead (engine/measure/prebuild.py): the first guess evaluated
beside the original's evaluation, and the speed ceilings' models built from one shared list.

Split from prebuild.py, which runs them from the engine's threads: these functions run in the
stage workers' processes and share nothing with the engine but files (the pass and evaluation
caches, the queue's claims, the guess's marker).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Item = tuple[dict[str, Any], tuple[str, ...]]
Items = list[Item]


GUESS_BUILDS = "2"  # the marker's word when the guess is in budget and its worker builds before ``later``


def evaluate_ahead(
    spec: Any,
    first: Item,
    later: Items,
    wait_s: float,
    marker: str,
    builds: tuple[Items, float | None, Queue] | None = None,
    calibrated: str | None = None,
) -> tuple[bool, list[bool]]:
    """In the first guess's stage worker: the guess, a ``marker`` file saying so to the engine (its search
    starts then), then each of ``later`` (``evaluate_ahead``) the same way, beside the builds; (the guess cached, each of ``later`` cached).

    ``builds`` (the ceilings' items, their budget, the queue): when the guess is in budget, ``later``
    is wanted only if the lighter stage finds it faster, after the ceilings -- so this worker first
    builds ``later``'s models and takes the first builder's place on the queue (the marker says
    ``GUESS_BUILDS``; ``{marker}.built`` once its builds are done), then waits until the ceilings are
    timed (``{marker}.go``, written by the engine) and evaluates ``later``: evaluating it at once, or
    beside the ceilings' timing, would crowd the cores and slow both. A guess that misses the budget
    goes on to ``later`` first: the likeliest next model in budget.
    ``calibrated``: the queue's file saying the ranges are cached, created once a calibrating guess is
    built -- the other builder quantizes the static ceilings while the guess is measured (it waited
    for the guess's evaluation, idle)."""
    figures = evaluate_first_guess(spec, first[0], first[1], wait_s, built_marker=calibrated)
    ok = figures is not None
    builder = ok and builds is not None and in_budget(spec, figures)
    (written := Path(f"{marker}.tmp")).write_text(GUESS_BUILDS if builder else "1" if ok else "0")
    written.replace(marker)  # whole, or not there
    if not ok:  # no reference to compare with: built only, as the ceilings (they are timed with them)
        return ok, [False] * build_variants(spec, later, None, False)
    if builder and builds is not None:
        items, budget_s, queue = builds
        build_variants(spec, later, None, False)  # the lighter stage times them with the guess
        # no node profile: a guess in budget ends most runs at the ceilings, and a run that goes on to
        # recover asks for it then (cached); the ceilings would wait for it
        count = build_variants(spec, items, budget_s, False, queue)
        (done := Path(f"{marker}.built.tmp")).write_text(str(count))
        done.replace(f"{marker}.built")
        # evaluated once the ceilings are timed (``{marker}.go``): beside their timing, on the other
        # core, the evaluation would slow their rounds
        go = Path(f"{marker}.go")
        waited = time.perf_counter()
        while not go.exists() and time.perf_counter() - waited < wait_s:
            time.sleep(0.02)
        print(f"ceilings timed at {time.time():.3f}: evaluating {len(later)} ahead", flush=True)
    return ok, [evaluate_first_guess(spec, point, flow, wait_s, label="ahead") is not None for point, flow in later]


ORIGINAL_WAIT_S = 5.0  # the most the guess's worker waits for the original's figures (agreement metrics)


def in_budget(spec: Any, figures: dict[str, float] | None, wait_s: float = ORIGINAL_WAIT_S) -> bool:
    """Whether a model with ``figures`` (evaluated ahead) meets the run's criterion against the
    original's metric; False when there are none, or the original's metric is not known within
    ``wait_s`` (:func:`original_metric`)."""
    from quantune.engine.executors.worker import runner_for
    from quantune.engine.trials.runner import original_metric

    runner = runner_for(spec)
    metric = runner.context.evaluator.spec.metric
    if runner.criterion is None or figures is None or metric not in figures:
        return False
    original = original_metric(runner.context, metric, wait_s)
    return original is not None and bool(runner.criterion.check(original, figures[metric]).meets)


def evaluate_first_guess(
    spec: Any,
    point: dict[str, Any],
    flow: tuple[str, ...],
    wait_s: float,
    label: str = "first guess",
    built_marker: str | None = None,
) -> dict[str, float] | None:
    """In the first guess's stage worker: its model built and measured (outputs, metric, latency),
    then compared with the original's outputs once they are in the cache (the baseline's stage,
    beside this one, writes them); the figures land in the evaluation cache, where the trial reads
    them, and are returned. None when the reference did not come within ``wait_s`` or the model
    failed (its trial then runs as any other, and says why). ``built_marker``: a file created once
    the model is built (a calibrating guess's ranges are cached then: the queue's ``calibrated``)."""
    from quantune.engine.executors.worker import launch_memory_probe, runner_for
    from quantune.engine.measure.baseline import shared_cores
    from quantune.engine.measure.probes import variant_model

    started = time.perf_counter()
    load_shapes_ahead(spec, [point])  # beside the run's set-up in this worker, when the guess needs it
    runner = runner_for(spec)
    launch_memory_probe(runner)  # its server's imports beside the build: the guess's figures end with memory
    context = runner.context
    shared_cores(context.evaluator)  # beside the original's evaluation; timed again as a ceiling
    # read in a thread as soon as the baseline's worker has written it: the reading overlaps the
    # build and measurement instead of following them
    reference = _Reference(runner, wait_s)
    ready = time.perf_counter()
    try:
        with _sessions_without_spinning():
            path, sha = variant_model(context, context.plan, point, flow, label=f" ({label})")
        built = time.perf_counter()
        if built_marker is not None:  # the other builder quantizes with these ranges beside the measuring
            Path(built_marker).touch()
        key = context.eval_key(sha)
        if (cached := context.cache.get_json("evals", key)) is not None:
            reference.cancel()
            return dict(cached["metrics"])
        measured = context.evaluator.measure(path)
    except Exception as exc:
        reference.cancel()
        print(f"{label} {point}: {type(exc).__name__}: {exc}", flush=True)
        return None
    done = time.perf_counter()
    if (outputs := reference.result()) is None:
        return None
    waited = time.perf_counter()
    figures = context.evaluator.figures(measured, outputs)
    context.cache.put_json("evals", key, {"metrics": figures, "ahead": spec.run_id})
    print(
        f"{label}: run set up in {ready - started:.1f} s, built in {built - ready:.1f} s, measured in "
        f"{done - built:.1f} s, the original's reference waited for {waited - done:.1f} s, compared in "
        f"{time.perf_counter() - waited:.1f} s",
        flush=True,
    )
    return figures


class _Reference(threading.Thread):
    """The original's packed outputs, read once the baseline's stage has cached them (polled: a
    file the other worker writes, before it times the original), or ``None`` after ``wait_s``."""

    def __init__(self, runner: Any, wait_s: float) -> None:
        super().__init__(name="quantune-reference", daemon=True)
        self._runner = runner
        self._deadline = time.monotonic() + wait_s
        self._cancelled = threading.Event()
        self._value: dict[str, Any] | None = None
        self.start()

    def run(self) -> None:
        from quantune.engine.measure.baseline import cached_reference

        while (value := cached_reference(self._runner)) is None:
            if time.monotonic() >= self._deadline or self._cancelled.wait(0.05):
                return
        self._value = value

    def cancel(self) -> None:
        """Stops the waiting (the guess failed or was already evaluated)."""
        self._cancelled.set()

    def result(self) -> dict[str, Any] | None:
        self.join()
        return self._value


@dataclass(frozen=True)
class Queue:
    """The builds' shared list, worked from both ends by two stage workers (processes): each item is
    claimed by creating a file in ``claims`` (whoever creates it builds it). The second worker
    (``reverse``) takes the light items first and a calibrating one only once ``calibrated`` exists
    -- the ranges are then cached and building is quantizing only --, so two processes never
    calibrate at once (the calibration's memory bound is per process)."""

    claims: str
    calibrated: str
    heavy: tuple[bool, ...]
    reverse: bool = False

    def claim(self, index: int) -> bool:
        try:
            os.close(os.open(os.path.join(self.claims, str(index)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def order(self) -> list[int]:
        indices = list(range(len(self.heavy)))
        return indices[::-1] if self.reverse else indices

    def mark_calibrated(self) -> None:
        Path(self.calibrated).touch()

    def wait_calibrated(self, deadline: float | None) -> bool:
        while not os.path.exists(self.calibrated):
            if deadline is not None and time.perf_counter() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def take(self, deadline: float | None = None) -> Iterator[int]:
        """The indices this worker builds, in its order, each claimed first (a calibrating one, in the
        second worker, once ``calibrated`` exists; none after ``deadline`` while waiting for it)."""
        for index in self.order():
            if self.reverse and self.heavy[index] and not self.wait_calibrated(deadline):
                return
            if not self.claim(index):
                continue
            try:
                yield index
            finally:  # built (or failed: the other worker then calibrates for its own)
                if self.heavy[index]:
                    self.mark_calibrated()


def build_variants(
    spec: Any, items: Items, budget_s: float | None, profile: bool = True, queue: Queue | None = None
) -> int:
    """In the stage worker: each point's model through the pass cache (as the ceiling stage's
    ``time_ceilings`` builds them), until ``budget_s`` is spent (at least one); how many were built.
    ``queue``: only the items this worker claims, in its order. ``profile``: then also the
    original's node profile."""
    from quantune.engine.executors.worker import runner_for
    from quantune.engine.measure.probes import measure_profile, variant_model

    load_shapes_ahead(spec, [point for point, _ in items])
    context = runner_for(spec).context
    deadline = None if not budget_s else time.perf_counter() + budget_s
    built = 0
    with _sessions_without_spinning():
        for index in queue.take(deadline) if queue is not None else range(len(items)):
            point, flow = items[index]
            if deadline is not None and built and time.perf_counter() >= deadline:
                break
            started = time.perf_counter()
            try:
                variant_model(context, context.plan, point, flow)
            except Exception as exc:  # the ceiling stage meets the same failure and reports it
                print(f"speed ceiling {point}: the passes failed ({type(exc).__name__}: {exc})", flush=True)
                continue
            built += 1
            values = ", ".join(f"{key.partition('.')[2]}={value}" for key, value in point.items() if "." in key)
            took = time.perf_counter() - started
            print(f"built {' > '.join(flow)} ({values}) in {took:.2f} s, at {time.time():.3f}", flush=True)
        try:  # the original's per-node profile, which the strategy asks for next (cached; a hint only)
            if profile:
                measure_profile(context)
        except Exception as exc:
            print(f"node profile: {type(exc).__name__}: {exc}", flush=True)
    return built


def load_shapes_ahead(spec: Any, points: list[Mapping[str, Any]]) -> None:
    """Starts loading onnxruntime's symbolic shape inference in a thread of this worker when a step
    of ``points`` needs it (:func:`needs_symbolic_shapes`; prepare.shapes.load_in_background)."""
    from quantune.prepare.shapes import load_in_background

    if needs_symbolic_shapes(points, step_passes(spec)):
        load_in_background()


def needs_symbolic_shapes(points: Iterable[Mapping[str, Any]], step_passes: Mapping[str, str]) -> bool:
    """Whether a step of one of ``points`` runs a pass that says its values need onnxruntime's
    symbolic shape inference (``Pass.needs_symbolic_shapes``); ``step_passes``: each step's pass
    name where it is not the step's own name. Read from the points' own values before the run is
    set up (a value the config fixes is not in them: that worker loads it at its first use).
    """
    from quantune.passes.registry import find_pass

    for point in points:
        steps: dict[str, dict[str, Any]] = {}
        for key, value in point.items():
            step, dot, name = key.partition(".")
            if dot:
                steps.setdefault(step, {})[name] = value
        for step, values in steps.items():
            cls = find_pass(str(step_passes.get(step, step)))
            if cls is not None and cls.needs_symbolic_shapes(values):
                return True
    return False


def step_passes(spec: Any) -> dict[str, str]:
    """Each configured step's pass name (from the worker's config: no set-up needed to read it)."""
    try:
        return {entry.step_id: entry.name for entry in spec.loaded.config.passes}
    except (AttributeError, TypeError):  # no such config (a test's spec): step names are pass names
        return {}


LIGHT_ROWS = 8  # a calibration on at most this many rows is light (a ceiling's stand-in, speed.stand_in)


def calibrates(flow: tuple[str, ...], step_passes: Any, point: Mapping[str, Any] | None = None) -> bool:
    """Whether ``flow`` (at ``point``) calibrates on more than ``LIGHT_ROWS`` rows (static
    quantization: heavy, memory bounded per process)."""
    from quantune.passes.registry import get_pass

    for step in flow:
        try:
            pass_cls = get_pass(str(step_passes.get(step, step)))
        except Exception:  # an unknown pass: treat it as heavy
            return True
        heavy, samples = pass_cls.needs_calibration, pass_cls.knobs.samples
        rows = (point or {}).get(f"{step}.{samples}") if samples else None
        if heavy and not (isinstance(rows, int) and rows <= LIGHT_ROWS):
            return True
    return False


@contextlib.contextmanager
def _sessions_without_spinning() -> Iterator[None]:
    """In the builds' worker: onnxruntime sessions (calibration's) whose idle threads sleep rather
    than spin, so the builds take no more of the machine than their work while the original is
    evaluated beside them. Spinning changes no figure, only how threads wait."""
    import onnxruntime as ort

    original = ort.InferenceSession

    class Quiet(original):  # type: ignore[misc, valid-type]
        def __init__(self, path_or_bytes: Any, sess_options: Any = None, *args: Any, **kwargs: Any) -> None:
            options = sess_options if sess_options is not None else ort.SessionOptions()
            for key in ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning"):
                with contextlib.suppress(Exception):
                    options.add_session_config_entry(key, "0")
            super().__init__(path_or_bytes, options, *args, **kwargs)

    ort.InferenceSession = Quiet
    try:
        yield
    finally:
        ort.InferenceSession = original
