"""The run's record (re-exported from the engine, which writes it) and :class:`PageWriter`, the run
listener that draws ``report.html`` at the end of a run."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from quantune.engine.outcome.result import Result, write_outputs
from quantune.wording import format_loss, format_ratio, speed_words

__all__ = ["PageWriter", "Result", "format_loss", "format_ratio", "speed_words", "write_outputs", "write_page"]

log = logging.getLogger("quantune")


def write_page(folder: Path, parameter_views: bool = True) -> None:
    """``report.html`` (and ``optuna.journal``) for the run just written; a page that cannot be drawn
    is logged, never costs the run its results. ``QUANTUNE_REPORT=0`` skips it."""
    if not _drawn():
        return
    from quantune.errors import DiskFull

    try:
        from quantune.report.html import write_report

        write_report(folder, parameter_views=parameter_views)
    except DiskFull:
        raise
    except KeyboardInterrupt as exc:  # a signal stops the drawing at once (the page is written whole or not at all)
        from quantune.engine.run.interrupts import stop_cause

        _not_drawn(f"interrupted ({stop_cause(exc)})", folder)
        raise
    except Exception as exc:
        _not_drawn(str(exc), folder)


def _not_drawn(why: str, folder: Path) -> None:
    """Says on the console and in the log that the page is missing and how to draw it."""
    import sys

    message = f"report.html not written: {why}; results.json is kept: `quantune report {folder}` draws the page"
    log.warning(message)
    print(f"quantune: warning: {message}", file=sys.stderr)


def _drawn() -> bool:
    return os.environ.get("QUANTUNE_REPORT", "1").strip().lower() not in ("0", "false", "no", "off")


class PageWriter:
    """A run listener that draws ``report.html`` once the results are written: without its Optuna views
    when the limit leaves no time for them (``quantune report`` draws them later)."""

    @property
    def end_cost_s(self) -> float:
        """About what drawing the whole page takes (its imports included), kept from ``stop.timeout_s``."""
        return 5.0 if _drawn() else 0.0

    @property
    def least_end_cost_s(self) -> float:
        """About what the page without its parameter views takes."""
        return 1.0 if _drawn() else 0.0

    def on_start(self, max_trials: int | None, baseline: dict[str, float]) -> None:
        pass

    def on_trial(self, record: object, status: object) -> None:
        pass

    def on_end(self, result: Result) -> None:
        """Draws the page; its seconds join the run's time breakdown and duration."""
        began = time.perf_counter()
        self._draw(result)
        spent = time.perf_counter() - began
        if _drawn() and result.time_spent_s:
            result.time_spent_s = {**result.time_spent_s, "report": round(spent, 3)}
            result.duration_s += spent

    def _draw(self, result: Result) -> None:
        left = result.time_left_s
        if left is not None and left < self.end_cost_s:
            log.info(
                "report.html without its parameter views: %.1f s left within stop.timeout_s, they take about "
                "%.0f s (quantune report %s draws them)",
                max(0.0, left),
                self.end_cost_s,
                result.output_dir,
            )
            write_page(Path(result.output_dir), parameter_views=False)
            return
        write_page(Path(result.output_dir))
