"""The run's record (re-exported from the engine, which writes it) and the page drawn from it.

``results.json``, ``best/`` and ``closest_miss/`` are written by the engine
(:mod:`quantune.engine.result`); ``report.html`` is drawn here at the end of a run by
:class:`PageWriter`, a run listener that :func:`quantune.tune` adds.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from quantune.engine.result import Result, write_outputs
from quantune.wording import format_loss, format_ratio, speed_words

__all__ = ["PageWriter", "Result", "format_loss", "format_ratio", "speed_words", "write_outputs", "write_page"]

log = logging.getLogger("quantune")


def write_page(folder: Path) -> None:
    """``report.html`` (and ``optuna.db``) for the run just written; a page that cannot be
    drawn is logged, never costs the run its results. ``QUANTUNE_REPORT=0`` skips it (the test
    suite sets it: drawing takes seconds per run)."""
    if os.environ.get("QUANTUNE_REPORT", "1").strip().lower() in ("0", "false", "no", "off"):
        return
    from quantune.errors import DiskFull

    try:
        from quantune.report.html import write_report

        write_report(folder)
    except DiskFull:
        raise
    except Exception as exc:
        log.warning("report.html not written: %s (quantune report %s draws it again)", exc, folder)


class PageWriter:
    """A run listener that draws ``report.html`` once the run's results are written."""

    @property
    def end_cost_s(self) -> float:
        """About what drawing the page takes (its imports included), kept from ``stop.timeout_s``."""
        return 0.0 if os.environ.get("QUANTUNE_REPORT", "1").strip().lower() in ("0", "false", "no", "off") else 5.0

    def on_start(self, max_trials: int | None, baseline: dict[str, float]) -> None:
        pass

    def on_trial(self, record: object, status: object) -> None:
        pass

    def on_end(self, result: Result) -> None:
        left = result.time_left_s
        if left is not None and left < self.end_cost_s:
            log.warning(
                "report.html not drawn: %.1f s left within stop.timeout_s, drawing takes about %.0f s "
                "(quantune report %s draws it)",
                max(0.0, left),
                self.end_cost_s,
                result.output_dir,
            )
            return
        write_page(Path(result.output_dir))
