"""Small behaviours a review found: the re-timing's share of the limit when the report is dropped,
and the cache's folders made again only when a put finds them missing."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np

from quantune.engine.run.deadline import EndBudget
from quantune.store import ArtifactCache


def test_the_retiming_keeps_no_time_for_a_report_that_is_dropped() -> None:
    """A report that would take over half of what is left is not drawn (report/result.py), so the
    re-timing may use its time; one that fits keeps its time."""
    dropped = EndBudget(100.0, time.perf_counter(), end_s=0.0, report_s=60.0, load_s=0.0)
    budget, why = dropped.retiming_budget(200.0, 1.0, 2)
    assert why == "" and budget is not None and budget > 90.0  # not 100 - 60
    kept = EndBudget(100.0, time.perf_counter(), end_s=0.0, report_s=10.0, load_s=0.0)
    budget, why = kept.retiming_budget(200.0, 1.0, 2)
    assert why == "" and budget is not None and budget <= 90.0


def test_puts_make_the_cache_folders_again_after_the_cache_was_deleted(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path / "cache")
    cache.put_json("evals", "a", {"x": 1})
    cache.put_arrays("k", {"y": np.arange(3)})
    shutil.rmtree(tmp_path / "cache")
    cache.put_json("evals", "b", {"x": 2})
    cache.put_arrays("k", {"y": np.arange(4)})
    assert cache.get_json("evals", "b") == {"x": 2} and cache.get_json("evals", "a") is None
    arrays = cache.get_arrays("k")
    assert arrays is not None and list(arrays["y"]) == [0, 1, 2, 3]
