"""The stage workers' side of the builds ahead (prebuild.py): the first guess evaluated beside the original's
evaluation, and the ceilings' models built from one shared list. Workers talk through what the engine handed them
(:class:`GuessLine`, :class:`Queue`), never the file system."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

Item = tuple[dict[str, Any], tuple[str, ...]]
Items = list[Item]


GUESS_BUILDS = "builds"  # the guess's word when it is in budget and its worker builds before ``later``


@dataclass(frozen=True)
class GuessLine:
    """The engine's line with the first guess's worker (``guess``, ``built``, ``ended``, ``go``): each side blocks on
    it."""

    reader: Any  # multiprocessing Connection
    writer: Any
    go: Any  # multiprocessing Event

    @classmethod
    def open(cls, context: Any) -> GuessLine:
        reader, writer = context.Pipe(duplex=False)
        return cls(reader, writer, context.Event())

    def say(self, kind: str, value: Any = None) -> None:
        self.writer.send((kind, value))

    def hear(self) -> tuple[str, Any]:
        return self.reader.recv()


def evaluate_ahead(
    spec: Any,
    first: Item,
    later: Items,
    wait_s: float,
    line: GuessLine,
    builds: tuple[Items, float | None, Queue] | None = None,
    calibrated: Any = None,
) -> tuple[bool, list[bool]]:
    """In the guess's worker: the guess, then ``later`` (after a guess in budget, once the ceilings are timed)."""
    figures = evaluate_first_guess(spec, first[0], first[1], wait_s, built=calibrated)
    ok = figures is not None
    builder = ok and builds is not None and in_budget(spec, figures)
    line.say("guess", GUESS_BUILDS if builder else "ok" if ok else "failed")
    if not ok:  # no reference to compare with: built only, as the ceilings (they are timed with them)
        return ok, [False] * build_variants(spec, later, None, False)
    if builder and builds is not None:
        items, budget_s, queue = builds
        build_variants(spec, later, None, False)  # the lighter stage times them with the guess
        # no node profile: a run that goes on to recover asks for it then; the ceilings would wait for it
        line.say("built", build_variants(spec, items, budget_s, False, queue))
        # evaluated once the ceilings are timed: beside their timing it would slow their rounds
        line.go.wait(wait_s)
        print(f"ceilings timed at {time.time():.3f}: evaluating {len(later)} ahead", flush=True)
    return ok, [evaluate_first_guess(spec, point, flow, wait_s, label="ahead") is not None for point, flow in later]


ORIGINAL_WAIT_S = 5.0  # the most the guess's worker waits for the original's figures (agreement metrics)


def in_budget(spec: Any, figures: dict[str, float] | None, wait_s: float = ORIGINAL_WAIT_S) -> bool:
    """Whether ``figures`` meet the criterion against the original's metric (known within ``wait_s``)."""
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
    built: Any = None,
) -> dict[str, float] | None:
    """In the guess's worker: its model built, measured and compared with the original's cached outputs, or None."""
    from quantune.engine.executors.worker import launch_memory_probe, runner_for
    from quantune.engine.measure.baseline import shared_cores
    from quantune.engine.measure.probes import variant_model

    started = time.perf_counter()
    load_shapes_ahead(spec, [point])  # beside the run's set-up in this worker, when the guess needs it
    runner = runner_for(spec)
    launch_memory_probe(runner)  # its server's imports beside the build: the guess's figures end with memory
    context = runner.context
    shared_cores(context.evaluator)  # beside the original's evaluation; timed again as a ceiling
    # read in a thread once the baseline's worker has written it, overlapping the build and measurement
    reference = _Reference(runner, wait_s)
    ready = time.perf_counter()
    try:
        with _sessions_without_spinning():
            path, sha = variant_model(context, context.plan, point, flow, label=f" ({label})")
        if built is not None:  # the other builder quantizes with these ranges beside the measuring
            built.set()
        built_at = time.perf_counter()
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
        f"{label}: run set up in {ready - started:.1f} s, built in {built_at - ready:.1f} s, measured in "
        f"{done - built_at:.1f} s, the original's reference waited for {waited - done:.1f} s, compared in "
        f"{time.perf_counter() - waited:.1f} s",
        flush=True,
    )
    return figures


class _Reference(threading.Thread):
    """The original's packed outputs, polled until the baseline's stage has cached them, or ``None`` after ``wait_s``."""

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
    """The builds' shared list, worked from both ends by two stage workers; never two calibrations at once."""

    claims: Any  # multiprocessing Array of flags
    calibrated: Any  # multiprocessing Event
    heavy: tuple[bool, ...]
    reverse: bool = False

    @classmethod
    def open(cls, heavy: Iterable[bool], context: Any) -> Queue:
        heavy = tuple(heavy)
        return cls(context.Array("b", max(1, len(heavy))), context.Event(), heavy)

    def claim(self, index: int) -> bool:
        with self.claims.get_lock():
            if self.claims[index]:
                return False
            self.claims[index] = 1
        return True

    def order(self) -> list[int]:
        indices = list(range(len(self.heavy)))
        return indices[::-1] if self.reverse else indices

    def mark_calibrated(self) -> None:
        self.calibrated.set()

    def wait_calibrated(self, deadline: float | None) -> bool:
        return bool(self.calibrated.wait(None if deadline is None else max(0.0, deadline - time.perf_counter())))

    def take(self, deadline: float | None = None) -> Iterator[int]:
        """The indices this worker builds, in its order, each claimed first."""
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
    """In the stage worker: each claimed point's model built until ``budget_s`` is spent (at least one); how many."""
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
    """Starts loading symbolic shape inference in a thread when a step of ``points`` needs it."""
    from quantune.prepare.shapes import load_in_background

    if needs_symbolic_shapes(points, step_passes(spec)):
        load_in_background()


def needs_symbolic_shapes(points: Iterable[Mapping[str, Any]], step_passes: Mapping[str, str]) -> bool:
    """Whether a step of ``points`` runs a pass whose values need symbolic shape inference."""
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
    """Whether ``flow`` calibrates on more than ``LIGHT_ROWS`` rows (heavy, memory bounded per process)."""
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
    """Sessions whose idle threads sleep, so the builds take no more of the machine than their work."""
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
