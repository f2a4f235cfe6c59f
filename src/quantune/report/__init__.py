"""What a person gets back: the Result, results.json, the best model, the console table, report.html."""

from __future__ import annotations

from quantune.report.html import write_report
from quantune.report.result import Result

__all__ = ["Result", "write_report"]
