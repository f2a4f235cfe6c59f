"""The speed ceilings' models, built while the original model is evaluated.

A speed-first strategy starts by timing each flow's fully-quantized variants against the
original (``ceiling_ratios``). Building them (calibration, quantization) needs no figure of
the original, yet it waited for the original's evaluation, the run's first heavy stage, with
the machine's other core idle. So before that evaluation the engine asks a throw-away copy of
the strategy which variants it will time -- the copy's first ``ask`` calls ``ceiling_ratios``,
which here records the points and stops it; every other probe refuses -- and builds them in a
stage worker of its own (``ceiling_build``), beside the evaluation's. The models land in the
pass cache, where the strategy's own ceiling stage finds them and only times them. Nothing
the strategy sees changes: the same passes with the same configs give the same models (only
sooner). A strategy that does not start with ceilings gets nothing built.

``QUANTUNE_PREBUILD=0`` turns it off (bench/startup.py times a run both ways).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from quantune.engine.executors.stage import Isolation, StageDeadline, run_stage

log = logging.getLogger("quantune.prebuild")

STAGE = "ceiling_build"
Item = tuple[dict[str, Any], tuple[str, ...]]
Items = list[Item]


class _Captured(Exception):
    def __init__(self, items: Items, budget_s: float | None) -> None:
        super().__init__("ceiling points captured")
        self.items = items
        self.budget_s = budget_s


class _Refused(Exception):
    """A probe the dry run may not use (it would measure models)."""


def enabled() -> bool:
    return os.environ.get("QUANTUNE_PREBUILD", "1").strip().lower() not in ("0", "false", "no", "off")


def ceiling_items(strategy: Any, make: Callable[[], Any]) -> tuple[Items, float | None, Item | None, Items]:
    """(the points and flows to build: those ``strategy`` will time first, then its ``build_ahead`` --
    the guess's lighter models --, its build budget, the first guess it evaluates before them or None,
    its ``evaluate_ahead``: the guess's compute-only model); nothing when it does not start with the
    speed ceilings (a first guess, then the ceilings). ``make`` builds a fresh strategy of the same kind."""
    from quantune.strategy.base import Outcome, Proposal

    problem = getattr(strategy, "problem", None)
    if problem is None or problem.ceiling_ratios is None or problem.objective != "latency":
        return [], None, None, []

    def capture(items: Any, threshold: float, budget_s: float | None) -> list[float | None]:
        raise _Captured([(dict(point), tuple(flow)) for point, flow in items], budget_s)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise _Refused

    dry = make()
    first: Item | None = None
    try:
        dry.bind(replace(problem, ceiling_ratios=capture, latency_ratio=refuse, sensitivity=refuse, node_costs=refuse))
        dry.observe_baseline({})
        proposal = dry.ask()
        while isinstance(proposal, Proposal) and proposal.stage.startswith("first guess"):  # and what follows it
            first = first or (dict(proposal.point), tuple(proposal.flow or ()))
            dry.tell(proposal, Outcome(None))
            proposal = dry.ask()
    except _Captured as captured:
        if first is None:
            return captured.items, captured.budget_s, first, []
        ahead = [(dict(point), tuple(flow)) for point, flow in getattr(dry, "evaluate_ahead", [])]
        built = [(dict(point), tuple(flow)) for point, flow in getattr(dry, "build_ahead", [])]
        return captured.items + [item for item in built if item not in captured.items], captured.budget_s, first, ahead
    except Exception as exc:  # the strategy wanted something else first: nothing to build ahead
        log.debug("no speed ceilings to build ahead: %s: %s", type(exc).__name__, exc)
    return [], None, None, []


def evaluate_ahead(spec: Any, first: Item, later: Items, wait_s: float, marker: str) -> tuple[bool, list[bool]]:
    """In the first guess's stage worker: the guess, a ``marker`` file saying so to the engine (its search
    starts then), then each of ``later`` (``evaluate_ahead``: PP-OCRv6's final model was a 2.4 s trial
    after the ceilings) the same way, beside the builds; (the guess cached, each of ``later`` cached)."""
    ok = evaluate_first_guess(spec, first[0], first[1], wait_s)
    (written := Path(f"{marker}.tmp")).write_text("1" if ok else "0")
    written.replace(marker)  # whole, or not there
    if not ok:  # no reference to compare with: built only, as the ceilings (they are timed with them)
        return ok, [False] * build_variants(spec, later, None, False)
    return ok, [evaluate_first_guess(spec, point, flow, wait_s, label="ahead") for point, flow in later]


def evaluate_first_guess(
    spec: Any, point: dict[str, Any], flow: tuple[str, ...], wait_s: float, label: str = "first guess"
) -> bool:
    """In the first guess's stage worker: its model built and measured (outputs, metric, latency),
    then compared with the original's outputs once they are in the cache (the baseline's stage,
    beside this one, writes them); the figures land in the evaluation cache, where the trial reads
    them. False when the reference did not come within ``wait_s`` or the model failed (its trial
    then runs as any other, and says why)."""
    from quantune.engine.baseline import shared_cores
    from quantune.engine.executors.worker import runner_for
    from quantune.engine.probes import _variant_model

    started = time.perf_counter()
    runner = runner_for(spec)
    context = runner.context
    shared_cores(context.evaluator)  # beside the original's evaluation; timed again as a ceiling
    # read in a thread as soon as the baseline's worker has written it: the reading overlaps the
    # build and measurement instead of following them (0.6 s for the captcha model's 217 MB)
    reference = _Reference(runner, wait_s)
    ready = time.perf_counter()
    try:
        with _sessions_without_spinning():
            path, sha = _variant_model(context, context.plan, point, flow, label=f" ({label})")
        built = time.perf_counter()
        key = context.eval_key(sha)
        if context.cache.get_json("evals", key) is not None:
            reference.cancel()
            return True
        measured = context.evaluator.measure(path)
    except Exception as exc:
        reference.cancel()
        print(f"{label} {point}: {type(exc).__name__}: {exc}", flush=True)
        return False
    done = time.perf_counter()
    if (outputs := reference.result()) is None:
        return False
    waited = time.perf_counter()
    figures = context.evaluator.figures(measured, outputs)
    context.cache.put_json("evals", key, {"metrics": figures, "ahead": spec.run_id})
    print(
        f"{label}: run set up in {ready - started:.1f} s, built in {built - ready:.1f} s, measured in "
        f"{done - built:.1f} s, the original's reference waited for {waited - done:.1f} s, compared in "
        f"{time.perf_counter() - waited:.1f} s",
        flush=True,
    )
    return True


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
        from quantune.engine.baseline import cached_reference

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


def build_variants(spec: Any, items: Items, budget_s: float | None, profile: bool = True) -> int:
    """In the stage worker: each point's model through the pass cache (as the ceiling stage's
    ``_ceilings`` builds them), until ``budget_s`` is spent (at least one); how many were built.
    ``profile``: then also the original's node profile."""
    from quantune.engine.executors.worker import runner_for
    from quantune.engine.probes import _profile, _variant_model

    context = runner_for(spec).context
    deadline = None if not budget_s else time.perf_counter() + budget_s
    built = 0
    with _sessions_without_spinning():
        for point, flow in items:
            if deadline is not None and built and time.perf_counter() >= deadline:
                break
            try:
                _variant_model(context, context.plan, point, flow)
            except Exception as exc:  # the ceiling stage meets the same failure and reports it
                print(f"speed ceiling {point}: the passes failed ({type(exc).__name__}: {exc})", flush=True)
                continue
            built += 1
        try:  # the original's per-node profile, which the strategy asks for next (cached; a hint only)
            if profile:
                _profile(context)
        except Exception as exc:
            print(f"node profile: {type(exc).__name__}: {exc}", flush=True)
    return built


def split_by_calibration(items: Items, step_passes: Any) -> list[Items]:
    """The items whose flow calibrates (static quantization: heavy, memory bounded per process)
    and the others (dynamic, weight-only: no calibration), each non-empty group once.

    Two workers build them side by side: the second core is free once the original's
    evaluation ends, and only one of them ever calibrates, so the calibration's memory bound
    still holds. MiniLM-L3: 6 ceilings built in 13.5 s one after another.
    """
    from quantune.passes.registry import get_pass

    def calibrates(flow: tuple[str, ...]) -> bool:
        for step in flow:
            try:
                if get_pass(str(step_passes.get(step, step))).needs_calibration:
                    return True
            except Exception:  # an unknown pass: treat it as heavy
                return True
        return False

    heavy = [item for item in items if calibrates(item[1])]
    light = [item for item in items if not calibrates(item[1])]
    return [group for group in (heavy, light) if group]


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


FIRST_GUESS = "first_guess"
FIRST_GUESS_WAIT_S = 600.0  # the most the first guess waits for the original's reference outputs


class Prebuild:
    """The ``ceiling_build`` stages running in threads of the engine (their workers are processes).

    With a first guess (the strategy's first trial, before its ceilings) its model is built and
    evaluated first, in a ``first_guess`` stage beside the original's evaluation -- two processes
    on the machine's two cores -- and the ceilings' builds start once it is done, so they do not
    slow it down (started once the original was done, they did: 4 processes on 2 cores). The
    points to evaluate ahead (``later``) follow the guess in its worker, beside the builds.
    """

    def __init__(
        self,
        spec: Any,
        groups: list[Items],
        budget_s: float | None,
        isolation: Isolation,
        first: Item | None = None,
        later: Items | None = None,
    ) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix="quantune-prebuild-"))
        self._isolation = replace(isolation, log_dir=self._tmp, deadline=StageDeadline())
        self.items = [item for group in groups for item in group]
        self.first = first
        self.first_evaluated = False
        self.later = list(later or []) if first is not None else []
        self.later_evaluated: Items = []
        self._first_done = threading.Event()
        self._stages = [STAGE if index == 0 else f"{STAGE}_{index + 1}" for index in range(len(groups))]
        self._built = [0] * len(groups)
        self._threads = [
            threading.Thread(
                target=self._run,
                args=(index, spec, group, budget_s),
                name=f"quantune-{self._stages[index].replace('_', '-')}",
                daemon=True,
            )
            for index, group in enumerate(groups)
        ]
        if first is not None:
            self._stages.append(FIRST_GUESS)
            guess = threading.Thread(target=self._guess, args=(spec, first), name="quantune-first-guess", daemon=True)
            self._threads.append(guess)
            guess.start()
        else:
            self._first_done.set()
        for thread in self._threads[: len(groups)]:
            thread.start()

    @property
    def built(self) -> int:
        return sum(self._built)

    def _guess(self, spec: Any, first: Item) -> None:
        marker, outcomes = self._tmp / "first_guess.done", []
        run = partial(run_stage, FIRST_GUESS, evaluate_ahead, spec, first, self.later, FIRST_GUESS_WAIT_S, str(marker))
        stage = threading.Thread(target=lambda: outcomes.append(run(isolation=self._isolation)), daemon=True)
        stage.start()
        try:  # the guess is done once its marker is written (the worker goes on with ``later``)
            while stage.is_alive() and not marker.exists():
                stage.join(0.02)
            self.first_evaluated = marker.exists() and marker.read_text() == "1"
        finally:
            self._first_done.set()
        stage.join()
        value = outcomes[0].value if outcomes and outcomes[0].ok else None
        if value:  # (the guess's answer came with the marker)
            self.later_evaluated = [item for item, ok in zip(self.later, value[1], strict=False) if ok]

    def _run(self, index: int, spec: Any, items: Items, budget_s: float | None) -> None:
        self._first_done.wait()  # the first guess alone beside the original's evaluation
        stage = self._stages[index]
        outcome = run_stage(stage, build_variants, spec, items, budget_s, index == 0, isolation=self._isolation)
        self._built[index] = outcome.value or 0

    @classmethod
    def start(cls, strategy: Any, make: Callable[[], Any], spec: Any, isolation: Isolation) -> Prebuild | None:
        """The stage started, or ``None`` (turned off, in-process runs, nothing to build)."""
        if isolation.inline or spec is None or not enabled():
            return None
        items, budget_s, first, later = ceiling_items(strategy, make)
        if not items:
            return None
        problem = getattr(strategy, "problem", None)
        rest = [item for item in items if item != first and item not in later]  # those are built where evaluated
        groups = split_by_calibration(rest, getattr(problem, "step_passes", {}))
        return cls(spec, groups, budget_s, isolation, first, later)

    def wait_first_guess(self, timeout_s: float | None = None) -> bool:
        """Waits until the first guess is evaluated (or failed); whether it is in the cache."""
        self._first_done.wait(timeout_s)
        return self.first_evaluated

    def wait_ahead(self, point: dict[str, Any], flow: tuple[str, ...], timeout_s: float | None = None) -> bool:
        """Whether ``point`` was evaluated ahead, waiting (at most ``timeout_s``) when it is one of ``later``
        (its trial then reads the cache: not evaluated twice). Else False, at once."""
        if (dict(point), tuple(flow)) not in self.later:
            return False
        for thread in self._threads[len(self._built) :]:  # the first guess's, which evaluates them
            thread.join(timeout_s)
        return (dict(point), tuple(flow)) in self.later_evaluated

    def ahead(self) -> list[Item]:
        """The first guess when it was evaluated ahead (its trial reads the cache), and ``later`` ones so far."""
        return ([self.first] if self.first_evaluated and self.first is not None else []) + list(self.later_evaluated)

    def join(self, deadline: float | None = None) -> None:
        """Waits for the builds; with ``deadline`` (``time.perf_counter()``, the run's limit) no longer
        than until then: builds still running are stopped (issue 23: one static build of a 225 KB
        model took 36 s on a loaded machine and the speed ceilings waited for it past a 60 s limit)."""
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.perf_counter()))
        if any(thread.is_alive() for thread in self._threads):
            self._isolation.deadline.reason = "stopped at the run's time limit (stop.timeout_s) before it was built"
            self._isolation.deadline.at = time.perf_counter()
            for thread in self._threads:
                thread.join()

    def cancel(self) -> None:
        """Stops the builds (the run ends before its ceilings) and waits for the workers to go."""
        if any(thread.is_alive() for thread in self._threads):
            self._isolation.deadline.reason = "cancelled: the run ended before its speed ceilings"
            self._isolation.deadline.at = time.perf_counter()
            self.join()
        self.keep_log(None)

    def keep_log(self, log_dir: Path | None) -> None:
        """The builds' worker log goes to ``log_dir`` (the run's workers folder; ``None``: dropped)."""
        if log_dir is not None:
            log.info("speed ceilings built ahead: %d of %d variants", self.built, len(self.items))
        for stage in self._stages:
            source = self._tmp / f"{stage}.log"
            if log_dir is not None and source.is_file():
                try:
                    log_dir.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, log_dir / source.name)
                except OSError:
                    pass
        shutil.rmtree(self._tmp, ignore_errors=True)
