"""report.html in a real browser: headless Chromium loads it offline, draws every plot, logs no
error; a screenshot is saved. Skips (saying why) only where no Chromium is installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import quantune

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from report_shot import find_chromium, shoot

pytestmark = pytest.mark.skipif(
    find_chromium() is None, reason="no Chromium on this machine (Debian: apt-get install chromium)"
)


def test_report_renders_in_chromium_without_console_errors(make_config, tmp_path, monkeypatch):
    pytest.importorskip("playwright", reason="the test extra's playwright is not installed")
    monkeypatch.setenv("QUANTUNE_REPORT", "1")
    out = tmp_path / "out"
    config = make_config(
        passes=[{"name": "static_quant", "search": True}],
        search={"sampler": "random", "seed": 0},
        stop={"max_trials": 6},
    )
    result = quantune.tune(config, output=out)
    png = tmp_path / "report.png"
    seen = shoot(out, png)
    assert seen["page_errors"] == [] and seen["console_errors"] == []
    # the trade-off, best-so-far, Pareto, precision and Optuna's views (each a .js-plotly-plot)
    assert seen["plots"] >= 6 and seen["svgs"] >= seen["plots"]
    ok = [t for t in result.trials if t.status == "ok"]
    assert seen["points"] >= len(ok)  # every finished trial is a point drawn in the svg
    assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 50_000
