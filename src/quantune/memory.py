"""Memory: the budget a stage chunks its work by, and the peak resident memory it reached.

A stage must fit its memory by chunking, not by failing, and work is sized by measurement
(one row's peak) rather than estimate, since a model's working memory is what it is. Peaks are
per stage, also in long-lived workers: ``VmHWM`` is reset when a stage starts (``ru_maxrss`` is
a lifetime maximum), with a ``VmRSS`` sampling thread where the reset is refused.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

_T = TypeVar("_T")

_MB = 1024 * 1024
_ENV_BUDGET = "QUANTUNE_MEMORY_BUDGET_MB"  # overrides the budget (benchmarks, tests)


def _status_kb(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ``VmSize``), or ``None``."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_mb() -> float:
    """Resident memory of this process now."""
    kb = _status_kb("VmRSS")
    if kb is None:  # no /proc: the lifetime peak is the best there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return kb / 1024


def total_memory_mb() -> float:
    """The machine's physical memory."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / _MB
    except (ValueError, OSError, AttributeError):
        return 8192.0


def memory_budget_mb() -> float:
    """Memory a stage may fill with its data: under an address-space limit, half of what is left of
    it (for allocator and onnxruntime overhead); without one, a quarter of the machine's memory."""
    override = os.environ.get(_ENV_BUDGET)
    if override:
        return max(1.0, float(override))
    default = total_memory_mb() / 4
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return default
    used = (_status_kb("VmSize") or 0) / 1024
    return max(64.0, min(default, (soft / _MB - used) / 2))


@dataclass(eq=False)  # trackers are told apart by identity, never by their figures
class Peak:
    """The peak resident memory (MB) a tracked block reached; final once the block ends."""

    mb: float = 0.0


_active: list[Peak] = []
_lock = threading.Lock()
_can_reset: bool | None = None


def _reset_hwm() -> bool:
    """Folds the high-water mark into every active tracker, then resets it; ``False`` if refused."""
    global _can_reset
    if _can_reset is False:
        return False
    hwm = _status_kb("VmHWM")
    if hwm is None:
        _can_reset = False
        return False
    for peak in _active:
        peak.mb = max(peak.mb, hwm / 1024)
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        _can_reset = False
        return False
    _can_reset = True
    return True


class _Sampler(threading.Thread):
    """Samples ``VmRSS`` until stopped: the fallback where the high-water mark cannot be reset."""

    def __init__(self, peak: Peak) -> None:
        super().__init__(daemon=True, name="quantune-rss-sampler")
        self.peak = peak
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.005):
            self.peak.mb = max(self.peak.mb, rss_mb())


@contextlib.contextmanager
def peak_tracker() -> Iterator[Peak]:
    """``with peak_tracker() as peak: ...`` -> ``peak.mb``, the block's peak resident memory."""
    peak = Peak(rss_mb())
    with _lock:
        exact = _reset_hwm()
        _active.append(peak)
    sampler = None if exact else _Sampler(peak)
    if sampler is not None:
        sampler.start()
    try:
        yield peak
    finally:
        if sampler is not None:
            sampler.done.set()
            sampler.join()
        with _lock:
            hwm = _status_kb("VmHWM") if exact else None
            for active in _active:
                active.mb = max(active.mb, peak.mb, (hwm or 0) / 1024, rss_mb())
            _active.remove(peak)


def room_mb(budget_mb: float | None = None) -> float:
    """What the budget (:func:`memory_budget_mb`, or ``budget_mb``) leaves of this process's
    resident memory now: the budget bounds a stage's peak, not its data alone."""
    budget = memory_budget_mb() if budget_mb is None else budget_mb
    return max(1.0, budget - rss_mb())


_FILL = 0.8  # of the room left under the budget, what pieces sized from one row may fill


def rows_in_budget(
    run_one_row: Callable[[], _T], budget_mb: float | None = None, held_per_row_mb: Callable[[_T], float] | None = None
) -> tuple[int, _T]:
    """``(rows, result)``: how many rows one piece of work may take so that this process's peak
    stays within the budget, and what the one measuring row gave.

    The row runs twice, because onnxruntime holds a shape's memory pattern from the second run on.
    Pieces fill only :data:`_FILL` of the room, as an arena grows by doubling regions. At least one row.
    """
    before, room = rss_mb(), room_mb(budget_mb)
    with peak_tracker() as peak:
        run_one_row()
        result = run_one_row()
    held = held_per_row_mb(result) if held_per_row_mb is not None else 0.0
    per_row = max(peak.mb - before, 1.0) + held
    return max(1, int(_FILL * room // per_row)), result


# Stage peaks measured inside this process, handed over with the trial's or stage's result.
_stage_peaks: dict[str, float] = {}


def note_stage_peak(stage: str, mb: float) -> None:
    """Remembers the highest peak of ``stage`` measured in this process since the last take."""
    _stage_peaks[stage] = max(_stage_peaks.get(stage, 0.0), round(mb, 1))


def take_stage_peaks() -> dict[str, float]:
    """The stage peaks noted since the last call (and forgets them)."""
    peaks = dict(_stage_peaks)
    _stage_peaks.clear()
    return peaks


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameters
_M_TRIM_THRESHOLD = -1
_SMALL_BLOCK = 128 * 1024
_fixed_threshold = False  # return_large_blocks() set this process's threshold


def return_large_blocks() -> bool:
    """Makes glibc map every block of 128 KB or more on its own, so freeing it returns it: otherwise
    the raised mmap threshold keeps freed batches in a fragmented heap that grows batch after batch."""
    global _fixed_threshold
    try:
        import ctypes

        _fixed_threshold = bool(ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, _SMALL_BLOCK))
    except (OSError, AttributeError):  # not glibc
        return False
    return _fixed_threshold


@contextlib.contextmanager
def reused_blocks(largest_mb: int = 64) -> Iterator[None]:
    """Blocks up to ``largest_mb`` come from the heap meanwhile (mapped, every temporary of a loop over
    equal blocks would fault in fresh zeroed pages); returned to the system at the end."""
    if not _fixed_threshold:  # glibc's own dynamic thresholds already reuse such blocks
        yield
        return
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(_M_MMAP_THRESHOLD, largest_mb << 20)
    libc.mallopt(_M_TRIM_THRESHOLD, 2 * largest_mb << 20)
    try:
        yield
    finally:
        libc.mallopt(_M_MMAP_THRESHOLD, _SMALL_BLOCK)
        libc.mallopt(_M_TRIM_THRESHOLD, _SMALL_BLOCK)
        libc.malloc_trim(0)
