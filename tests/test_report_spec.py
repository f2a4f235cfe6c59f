"""The report's figures are plain JSON (report/spec.py): each one must be a figure plotly knows.

plotly's ``graph_objects`` reject any property they do not know; the report no longer builds
through them (their validation was most of the report's time), so each figure is built here
through ``go.Figure`` once -- a misspelt property fails this test rather than a user's page --
and the two plotly layouts the report imitates (side-by-side plots, a horizontal line) are
compared with plotly's own.
"""

from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest
from plotly.subplots import make_subplots

import quantune
from quantune.engine.outcome.result import Result
from quantune.report import plots
from quantune.report.precision import precision_bars
from quantune.report.spec import Spec, merged


def _valid(spec: Spec) -> dict:
    figure = spec.to_dict()
    go.Figure(figure)  # raises ValueError on a property plotly does not know
    return figure


@pytest.fixture
def results(make_config, tmp_path) -> tuple[dict, object]:
    out = tmp_path / "out"
    config = make_config(passes=[{"name": "static_quant", "search": True}], search={"sampler": "random", "seed": 0})
    quantune.tune(config, output=out)
    return json.loads((out / "results.json").read_text()), out


def _variants(raw: dict, out) -> list[Result]:
    """The run as it ended, with a failed trial, with none in budget, and with latencies a decade apart."""
    failed = json.loads(json.dumps(raw))
    failed["trials"][0].update(status="failed", error="boom", metrics={}, accuracy_loss=None)
    missed = json.loads(json.dumps(raw))
    for trial in missed["trials"]:
        trial["meets_criterion"] = False
    missed["best"] = None
    spread = json.loads(json.dumps(raw))
    for index, trial in enumerate(spread["trials"]):
        if trial.get("metrics", {}).get("latency_ms"):
            trial["metrics"]["latency_ms"] *= 30.0**index
    return [Result.from_json(r, out) for r in (raw, failed, missed, spread)]


def test_every_figure_is_one_plotly_accepts(results):
    for result in _variants(*results):
        for build in (plots.trade_off, plots.progress, plots.pareto):
            figure = _valid(build(result))
            assert figure["data"] and all(trace["type"] == "scatter" for trace in figure["data"])
    bars = _valid(precision_bars({"Conv": {"int8": 3, "fp32": 1}, "MatMul": {"uint8": 2}}))
    assert [trace["name"] for trace in bars["data"]] == ["int8", "uint8", "fp32"]


def test_side_by_side_plots_and_lines_are_laid_out_as_plotly_lays_them_out():
    ours = Spec(columns=2, titles=("left", "right")).add_trace({"type": "scatter", "x": [1], "y": [2]}, col=2)
    theirs = make_subplots(rows=1, cols=2, subplot_titles=("left", "right"))
    theirs.add_trace(go.Scatter(x=[1], y=[2]), row=1, col=2)
    plotly, mine = theirs.to_dict(), ours.to_dict()
    for key in ("xaxis", "yaxis", "xaxis2", "yaxis2", "annotations"):
        assert mine["layout"][key] == plotly["layout"][key]
    assert (mine["data"][0]["xaxis"], mine["data"][0]["yaxis"]) == (
        plotly["data"][0]["xaxis"],
        plotly["data"][0]["yaxis"],
    )

    line = {"color": "red", "dash": "dash"}
    ours = Spec().add_trace({"type": "scatter", "x": [1], "y": [2]}).add_hline(0.5, line, "budget")
    theirs = go.Figure(go.Scatter(x=[1], y=[2]))
    theirs.add_hline(y=0.5, line=line, annotation_text="budget", annotation_position="top right")
    plotly, mine = theirs.to_dict(), ours.to_dict()
    assert mine["layout"]["shapes"] == plotly["layout"]["shapes"]
    assert mine["layout"]["annotations"] == plotly["layout"]["annotations"]


def test_layout_updates_merge_nested_keys_as_plotly_does():
    spec = Spec().update_layout(legend={"orientation": "h"}).update_layout(legend={"font": {"size": 11}})
    assert spec.layout["legend"] == {"orientation": "h", "font": {"size": 11}}
    assert merged({"a": {"b": 1}}, {"a": 2}) == {"a": 2}
