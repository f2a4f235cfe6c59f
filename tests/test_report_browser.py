"""report.html in a real browser: headless Chromium loads it offline, draws every plot, logs no
error; a screenshot is saved. Skips (saying why) only where no Chromium is installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import quantune
from quantune.report.html import VIEW_TRIALS

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


SPACE = {"weight_type": ["int8", "uint8"], "per_channel": [True, False], "reduce_range": [True, False]}


def test_the_trial_table_sorts_and_filters_and_the_target_toggle_redraws(make_config, tmp_path, monkeypatch):
    pytest.importorskip("playwright", reason="the test extra's playwright is not installed")
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("QUANTUNE_REPORT", "1")
    searched = {name: {"search": values} for name, values in SPACE.items()}
    result = quantune.tune(make_config([{"name": "dynamic_quant", "params": searched}]), output=tmp_path / "out")
    numbers = sorted(t.number for t in result.trials)
    assert len(numbers) >= VIEW_TRIALS  # the parameter views are drawn
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=find_chromium(), headless=True, args=["--no-sandbox"])
        try:
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            tab.goto((tmp_path / "out" / "report.html").as_uri())
            first = "document.querySelector('#trials tbody tr').cells[0].textContent"
            tab.click("#trials th:nth-child(1)")  # ascending
            tab.click("#trials th:nth-child(1)")  # descending
            assert tab.evaluate(first) == str(numbers[-1])
            tab.select_option("#state", "failed")
            assert tab.inner_text("#shown").startswith("0 of ")
            tab.select_option("#state", "")
            tab.fill("#filter", "no trial has this text")
            assert tab.inner_text("#shown").startswith("0 of ")
            tab.fill("#filter", "weight_type=uint8")
            uint8 = sum(t.params.get("dynamic_quant.weight_type") == "uint8" for t in result.trials)
            assert 0 < uint8 < len(numbers)
            assert tab.inner_text("#shown").startswith(f"{uint8} of {len(numbers)}")
            tab.click("input[value=loss]")
            assert tab.locator("#plot-slice-loss").bounding_box()["width"] > 300  # drawn at its width once shown
        finally:
            browser.close()
