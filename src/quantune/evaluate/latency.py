"""Latency measured, never assumed: warm-up, then repeated timed runs of one fixed feed (with a runner, the runner over
it). Threads are set explicitly and spinning disabled, so figures are comparable; :func:`timing_session` and
:func:`timed_call` are what every in-process timing uses."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from quantune import progress
from quantune.evaluate.interleave import fewest_within, interleaved
from quantune.evaluate.session import DEFAULT_PROVIDER, open_session
from quantune.evaluate.session_file import read_session_settings

# A rule over the rounds timed so far (seconds, one row per model): is the answer known?
Settled = Callable[[np.ndarray], bool]
SETTLE_FROM = 10  # the fewest rounds a settled rule is asked about
SETTLE_EVERY = 3  # then asked again every this many rounds


TIME_SHARE_S = 10.0  # a timing's default time share per model timed (evaluation.latency.seconds)
WARMUP_SHARE = 0.25  # the part of it warm-up may take, past each model's first warm-up call
FEWEST_ROUNDS = 3  # the fewest rounds of one model's own figures (not a paired decision) cut by time


@dataclass(frozen=True)
class LatencySpec:
    warmup: int = 10
    repeats: int = 50
    threads: int = 1
    batch_size: int | None = None  # None: the data's batch size
    feed: int = 0  # which evaluation feed (or batch) is timed
    # The time share per model timed: a timing of n models starts no round past n times this (after its fewest) and
    # warms up for at most ``WARMUP_SHARE`` of it, so a slow model is timed in seconds, not minutes.
    seconds: float = TIME_SHARE_S


@dataclass(frozen=True)
class TimingRequest:
    """One timing asked of a backend, row 0 the original; with a ``threshold``: :func:`.rounds.time_until_decided`."""

    models: tuple[Path, ...]
    feed: dict[str, np.ndarray]
    spec: LatencySpec
    runner: Callable | None = None
    settings: Mapping[str, Any] | None = None
    deadline: float | None = None
    min_rounds: int = 5
    settled: Settled | None = None
    threshold: float | None = None
    max_rounds: int = 20
    chunk: int = 3
    limit: float | None = None
    original_rounds: int = 0
    pairs: Sequence[tuple[int, int]] = ()
    early: bool = False
    anchor: int | None = None


def timing_cost_s(
    warmup: int, repeats: int, seconds: float, round_s: float, models: int = 1, fewest: int = FEWEST_ROUNDS
) -> float:
    """About how long a timing of ``models`` models takes at ``round_s`` a round (:func:`.interleave.interleaved`)."""
    if round_s <= 0.0:
        return 0.0
    share_s = seconds * max(1, models)
    return (warmup_passes(warmup, share_s, round_s) + rounds_within(repeats, share_s, round_s, fewest)) * round_s


def rounds_within(repeats: int, share_s: float, round_s: float, fewest: int = FEWEST_ROUNDS) -> int:
    """The rounds a timing runs at ``round_s`` a round in ``share_s``: at least ``fewest``, at most ``repeats``."""
    if round_s <= 0.0:
        return repeats
    return min(repeats, max(fewest_within(fewest, share_s, round_s), math.ceil(share_s / round_s)))


def warmup_passes(warmup: int, share_s: float, round_s: float) -> int:
    """The warm-up passes in ``share_s`` at ``round_s`` a pass: at least one, within ``WARMUP_SHARE`` of it."""
    if round_s <= 0.0:
        return warmup
    return max(1, min(warmup, math.ceil(WARMUP_SHARE * share_s / round_s)))


def timing_end(spec: LatencySpec, models: int, deadline: float | None = None) -> float:
    """The ``time.perf_counter()`` reading past which a timing starts no round: its share, or ``deadline``."""
    end = time.perf_counter() + spec.seconds * max(1, models)
    return end if deadline is None else min(end, deadline)


LANE_SLICE_S = 0.5  # the longest a timing holds the lane while another process waits for it
LANE_POLL_S = 0.005  # how often a holder that let a waiter in looks whether it has taken the lane


class LatencyLane:
    """One latency measurement at a time on this machine: a lock file held round by round (:meth:`between_rounds`)."""

    def __init__(self, path: Path | None = None, say: Callable[[str], None] | None = None) -> None:
        self.path = path or Path(
            os.environ.get("QUANTUNE_LATENCY_LOCK") or Path(tempfile.gettempdir()) / "quantune-latency.lock"
        )
        self.say = say or _to_stdout
        self._fd: int | None = None
        self._since = 0.0
        self._said = False

    def __enter__(self) -> LatencyLane:
        self.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        self.release()

    def _marker(self) -> Path:
        return self.path.with_name(f"{self.path.name}.waiting-{os.getpid()}-{threading.get_ident()}")

    def acquire(self) -> None:
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            if not self._said:  # once a timing: two that take turns would say it every slice
                self._said = True
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                self.say(f"waiting for the latency lane: another timing on this machine holds it (pid {holder})")
            marker = self._marker()
            marker.touch()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            finally:
                marker.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the pid only names the holder to a waiter
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd, self._since = fd, time.perf_counter()

    def release(self) -> None:
        import fcntl

        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def waiters(self) -> list[Path]:
        """The markers of processes (or threads) waiting for the lane now, the dead ones' dropped."""
        found = []
        for marker in self.path.parent.glob(f"{self.path.name}.waiting-*"):
            pid = marker.name.rsplit("-", 2)[-2]
            try:
                os.kill(int(pid), 0)
            except (ValueError, ProcessLookupError):
                marker.unlink(missing_ok=True)
                continue
            except PermissionError:  # another user's live process
                pass
            found.append(marker)
        return found

    def between_rounds(self) -> None:
        """After ``LANE_SLICE_S`` held, lets those waiting now take the lane, then takes it again."""
        if self._fd is None or time.perf_counter() - self._since < LANE_SLICE_S:
            return
        waiting = self.waiters()
        if not waiting:
            self._since = time.perf_counter()
            return
        self.release()
        while set(waiting) & set(self.waiters()):  # a waiter that died meanwhile is dropped there
            time.sleep(LANE_POLL_S)
        self.acquire()


def _to_stdout(line: str) -> None:
    """A progress notice on stdout: stderr holds only a failure's one line."""
    print(f"quantune: {line}", flush=True)


@contextlib.contextmanager
def latency_lane() -> Iterator[LatencyLane | None]:
    """The machine's :class:`LatencyLane`, held for the block (``None`` without ``fcntl``)."""
    try:
        import fcntl  # noqa: F401
    except ImportError:
        yield None
        return
    with LatencyLane() as lane:
        yield lane


def timing_session(
    model: Path,
    spec: LatencySpec,
    provider: str = DEFAULT_PROVIDER,
    provider_options: dict | None = None,
    settings: Mapping[str, Any] | None = None,
) -> ort.InferenceSession:
    """A session timed as the candidate runs: with ``settings``, else those stored beside the model."""
    return open_session(
        model,
        threads=spec.threads,
        timing=True,
        settings=read_session_settings(model) if settings is None else settings,
        provider=provider,
        provider_options=provider_options,
    )


def open_all(openers: Sequence[Callable[[], Any]]) -> list[Any]:
    """Each opener's result or exception, run on the cores at once (sessions build without the GIL), nothing timed."""

    def attempt(opener: Callable[[], Any]) -> Any:
        try:
            return opener()
        except Exception as exc:  # the caller says what a failure means (a candidate sits out)
            return exc

    workers = min(len(openers), os.cpu_count() or 1)
    if workers <= 1:
        return [attempt(opener) for opener in openers]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="quantune-open") as pool:
        return list(pool.map(attempt, openers))


def timed_call(
    session: ort.InferenceSession, feeds: dict[str, np.ndarray], runner: Callable | None
) -> Callable[[], object]:
    """The timed call: one ``session.run`` on the feed, or the runner over that one feed."""
    if runner is None:
        return lambda: session.run(None, feeds)
    return lambda: runner(session, [feeds])


def latency_figures(timings_s: np.ndarray) -> dict[str, float]:
    """Median, p90 and mean in milliseconds of one model's timed runs (seconds)."""
    timings = np.asarray(timings_s, dtype=np.float64) * 1000.0
    return {
        "latency_ms": float(np.median(timings)),
        "latency_p90_ms": float(np.percentile(timings, 90)),
        "latency_mean_ms": float(np.mean(timings)),
    }


def measure_latency(
    model: Path, feeds: dict[str, np.ndarray], spec: LatencySpec, *, runner: Callable | None = None
) -> dict[str, float]:
    """Median, p90 and mean in milliseconds of ``spec.repeats`` timed runs, in the latency lane."""
    return latency_figures(time_side_by_side([model], feeds, spec, runner=runner)[0])


def measure_side_by_side(
    models: list[Path], feeds: dict[str, np.ndarray], spec: LatencySpec, *, runner: Callable | None = None
) -> list[dict[str, float]]:
    """``measure_latency`` for several models at once, interleaved so the machine's drift lands on all alike."""
    return [latency_figures(row) for row in time_side_by_side(models, feeds, spec, runner=runner)]


def time_side_by_side(
    models: list[Path],
    feeds: dict[str, np.ndarray],
    spec: LatencySpec,
    *,
    runner: Callable | None = None,
    provider: str = DEFAULT_PROVIDER,
    provider_options: dict | None = None,
    settings: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
    deadline: float | None = None,
    min_rounds: int = 5,
    settled: Settled | None = None,
) -> np.ndarray:
    """The raw timings of ``measure_side_by_side``: seconds, one row per model, one column per round; ``settings`` for
    all or per model. No round past ``deadline`` or the share after ``min_rounds``; ``settled`` may end them."""
    chosen = list(settings) if isinstance(settings, Sequence) else [settings] * len(models)
    sessions = open_all(
        [
            partial(timing_session, model, spec, provider, provider_options, setting)
            for model, setting in zip(models, chosen, strict=True)
        ]
    )
    if (failed := next((s for s in sessions if isinstance(s, BaseException)), None)) is not None:
        raise failed  # every model must run here (the first that cannot, as before)
    calls = [timed_call(session, feeds, runner) for session in sessions]

    def after(rounds: np.ndarray) -> bool:
        progress.tick(rounds.shape[1], spec.repeats, "rounds")
        return settled is not None and settle_now(rounds.shape[1]) and settled(rounds)

    with latency_lane() as lane:
        between = None if lane is None else lane.between_rounds
        warmup_s = WARMUP_SHARE * spec.seconds * max(1, len(calls))
        interleaved(calls, 0, warmup=spec.warmup, warmup_s=warmup_s, between=between)
        end, fewest = timing_end(spec, len(calls), deadline), min(min_rounds, spec.repeats)
        share_s = spec.seconds * max(1, len(calls))
        return interleaved(calls, spec.repeats, end=end, fewest=fewest, share_s=share_s, between=between, after=after)


def settle_now(done: int) -> bool:
    """Whether a ``settled`` rule is asked after ``done`` rounds: at ``SETTLE_FROM``, then every ``SETTLE_EVERY``."""
    return done >= SETTLE_FROM and (done - SETTLE_FROM) % SETTLE_EVERY == 0
