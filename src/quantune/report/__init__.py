"""What a person gets back: the Result, results.json, the best model, the console table."""

from __future__ import annotations

from quantune.report.result import Result, write_outputs

__all__ = ["Result", "write_outputs"]
