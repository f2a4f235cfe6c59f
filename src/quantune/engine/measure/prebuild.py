"""The speed ceilings' models, built while the original model is evaluated: what a fresh copy of the strategy says it
will time first (``Strategy.first_requests``) lands in the pass cache early. ``QUANTUNE_PREBUILD=0`` turns it off."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from quantune.engine.executors.stage import Isolation, StageDeadline, run_stage
from quantune.engine.measure.ahead import GUESS_BUILDS, GuessLine, Queue, build_variants, calibrates, evaluate_ahead
from quantune.forkserver import worker_context

log = logging.getLogger("quantune.prebuild")

STAGE = "ceiling_build"
Item = tuple[dict[str, Any], tuple[str, ...]]
Items = list[Item]


def enabled() -> bool:
    return os.environ.get("QUANTUNE_PREBUILD", "1").strip().lower() not in ("0", "false", "no", "off")


def ceiling_items(strategy: Any, make: Callable[[], Any]) -> tuple[Items, float | None, Item | None, Items]:
    """What a fresh strategy made by ``make`` declares it builds first (``Strategy.first_requests``), or nothing."""
    problem = getattr(strategy, "problem", None)
    if problem is None or problem.ceiling_ratios is None or problem.objective != "latency":
        return [], None, None, []
    fresh = make()  # declaring them sets up what its first asks would: the run's own strategy stays as it is
    fresh.bind(problem)
    return fresh.first_requests()


FIRST_GUESS = "first_guess"
FIRST_GUESS_WAIT_S = 600.0  # the most the first guess waits for the original's reference outputs


class Prebuild:
    """The ``ceiling_build`` stages, run from the engine's threads: a first guess, then builds from both ends."""

    def __init__(
        self,
        spec: Any,
        items: Items,
        heavy: list[bool],
        budget_s: float | None,
        isolation: Isolation,
        first: Item | None = None,
        later: Items | None = None,
        first_calibrates: bool = False,
    ) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix="quantune-prebuild-"))
        self._isolation = replace(isolation, log_dir=self._tmp, deadline=StageDeadline())
        self.items = list(items)
        self.first = first
        self.first_evaluated = False
        self.later = list(later or []) if first is not None else []
        self.later_evaluated: Items = []
        self._first_done = threading.Event()
        self._guess_builds = False  # the guess is in budget: its worker takes the first builder's place
        self._guess_built = threading.Event()  # ... and has built its share
        self._core_free = threading.Event()  # the original's evaluation or the guess is done: a core builds
        self._first_calibrates = first_calibrates
        self._log_dir: Path | None = None  # where the workers' logs go (keep_log)
        self._line = GuessLine.open(worker_context())  # the guess's worker's line to this engine
        self._queue = Queue.open(heavy, worker_context())
        workers = 1 if len(items) < 2 else 2
        self._stages = [STAGE if index == 0 else f"{STAGE}_{index + 1}" for index in range(workers)]
        self._built = [0] * workers
        self._budget_s = budget_s
        self._threads = [
            threading.Thread(
                target=self._run,
                args=(index, spec, budget_s),
                name=f"quantune-{self._stages[index].replace('_', '-')}",
                daemon=True,
            )
            for index in range(workers)
        ]
        if first is not None:
            self._stages.append(FIRST_GUESS)
            guess = threading.Thread(target=self._guess, args=(spec, first), name="quantune-first-guess", daemon=True)
            self._threads.append(guess)
            guess.start()
        else:
            self._first_done.set()
            self._core_free.set()
        for thread in self._threads[:workers]:
            thread.start()

    @property
    def built(self) -> int:
        return sum(self._built)

    def original_done(self) -> None:
        """The original's evaluation is over: its core may build (the second worker starts)."""
        self._core_free.set()

    def _guess(self, spec: Any, first: Item) -> None:
        line, outcomes = self._line, []
        builds = (self.items, self._budget_s, self._queue) if self.later and self.items else None
        calibrated = self._queue.calibrated if self._first_calibrates else None  # once the guess is built
        run = partial(run_stage, FIRST_GUESS, evaluate_ahead, spec, first, self.later, FIRST_GUESS_WAIT_S, line)

        def stage() -> None:
            try:
                outcomes.append(run(builds, calibrated, isolation=self._isolation))
            finally:  # the worker is gone (done, dead or stopped): what it did not say, it will not
                line.say("ended")

        thread = threading.Thread(target=stage, daemon=True)
        thread.start()
        try:  # the guess is done once its worker says so (it goes on with ``later``)
            kind, word = line.hear()
            self.first_evaluated = kind == "guess" and word in ("ok", GUESS_BUILDS)
            self._guess_builds = kind == "guess" and word == GUESS_BUILDS
            if self.first_evaluated and self._first_calibrates:
                self._queue.mark_calibrated()  # its ranges are cached: the ceilings' builds only quantize
        finally:
            self._first_done.set()
            self._core_free.set()
        try:  # in budget: its share of the builds, then ``later``
            if self._guess_builds and (heard := line.hear())[0] == "built":
                self._built[0] = int(heard[1] or 0)
        finally:
            self._guess_built.set()
        thread.join()
        value = outcomes[0].value if outcomes and outcomes[0].ok else None
        if value:  # (the guess's answer came with the marker)
            self.later_evaluated = [item for item, ok in zip(self.later, value[1], strict=False) if ok]

    def _run(self, index: int, spec: Any, budget_s: float | None) -> None:
        if index == 0:
            self._first_done.wait()  # the first guess alone beside the original's evaluation
            if self._guess_builds:  # its worker builds in this one's place (ahead.evaluate_ahead)
                return
        else:
            self._core_free.wait()
        stage = self._stages[index]
        queue = replace(self._queue, reverse=index > 0)
        outcome = run_stage(
            stage, build_variants, spec, self.items, budget_s, index == 0, queue, isolation=self._isolation
        )
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
        passes = getattr(problem, "step_passes", {})
        heavy = [calibrates(flow, passes, point) for point, flow in rest]
        rest = [item for _, item in sorted(zip(heavy, rest, strict=True), key=lambda pair: not pair[0])]  # heavy first
        heavy.sort(reverse=True)
        first_calibrates = first is not None and calibrates(first[1], passes, first[0])
        return cls(spec, rest, heavy, budget_s, isolation, first, later, first_calibrates)

    def wait_first_guess(self, timeout_s: float | None = None) -> bool:
        """Waits until the first guess is evaluated (or failed); whether it is in the cache."""
        self._first_done.wait(timeout_s)
        return self.first_evaluated

    def ceilings_timed(self) -> None:
        """The speed ceilings are timed: the guess's worker may evaluate ``later`` now."""
        self._line.go.set()

    def wait_ahead(self, point: dict[str, Any], flow: tuple[str, ...], timeout_s: float | None = None) -> bool:
        """Whether ``point`` was evaluated ahead, waiting at most ``timeout_s`` when it is one of ``later``."""
        if (dict(point), tuple(flow)) not in self.later:
            return False
        self.ceilings_timed()  # wanted now, whatever the ceilings did
        for thread in self._threads[len(self._built) :]:  # the first guess's, which evaluates them
            thread.join(timeout_s)
        return (dict(point), tuple(flow)) in self.later_evaluated

    def ahead(self) -> list[Item]:
        """The first guess when it was evaluated ahead (its trial reads the cache), and ``later`` ones so far."""
        return ([self.first] if self.first_evaluated and self.first is not None else []) + list(self.later_evaluated)

    def join(self, deadline: float | None = None, builds_only: bool = False) -> None:
        """Waits for the builds (``builds_only``: not the guess's worker); at ``deadline`` the builds are stopped."""
        threads = self._threads[: len(self._built)] if builds_only else self._threads
        for thread in threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.perf_counter()))
        if builds_only and self._first_done.is_set() and self._guess_builds:  # the guess's worker builds too
            self._guess_built.wait(None if deadline is None else max(0.0, deadline - time.perf_counter()))
            if not self._guess_built.is_set():
                threads = self._threads  # past the limit: stopped below with the builders
        if any(thread.is_alive() for thread in threads):
            self._isolation.deadline.reason = "stopped at the run's time limit (stop.timeout_s) before it was built"
            self._isolation.deadline.at = time.perf_counter()
            for thread in threads:
                thread.join()

    def cancel(self) -> None:
        """Stops what still runs, waits for the workers to go, and keeps the logs where ``keep_log`` said."""
        if any(thread.is_alive() for thread in self._threads):
            self._isolation.deadline.reason = "cancelled: the run ended before it was needed"
            self._isolation.deadline.unneeded = True
            self._isolation.deadline.at = time.perf_counter()
            self.join()
        self.keep_log(self._log_dir, final=True)

    def keep_log(self, log_dir: Path | None, final: bool = False) -> None:
        """The workers' logs go to ``log_dir`` (``None``: dropped), now and again at the end (``final``)."""
        if log_dir is not None and not final:
            log.info("speed ceilings built ahead: %d of %d variants", self.built, len(self.items))
            self._log_dir = log_dir
        for stage in self._stages:
            source = self._tmp / f"{stage}.log"
            if log_dir is not None and source.is_file():
                try:
                    log_dir.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, log_dir / source.name)
                except OSError:
                    pass
        if final or not any(thread.is_alive() for thread in self._threads):
            shutil.rmtree(self._tmp, ignore_errors=True)
