"""report.html: one self-contained, interactive page per run (plotly inlined, Optuna's views)."""

from __future__ import annotations

import io
import json
import re
import shutil

import optuna
import pytest

import quantune
from quantune.cli import main
from quantune.report.html import VIEW_TRIALS, render_html
from quantune.report.study import STUDY_FILE, STUDY_NAME, journal_storage, load_run_study

PLOTS = ("plot-trade-off", "plot-progress", "plot-pareto")


@pytest.fixture(autouse=True)
def _report_at_the_end_of_runs(monkeypatch):
    monkeypatch.setenv("QUANTUNE_REPORT", "1")  # the suite skips it elsewhere; here it is what is tested


def _rows(page: str) -> list[int]:
    return sorted(
        int(n) for n in re.findall(r'<tr class="[\w ]*" data-state="\w+"><td data-v="[^"]+">(\d+)</td>', page)
    )


def test_every_run_ends_with_a_self_contained_report_and_an_optuna_study(make_config, tmp_path):
    out = tmp_path / "out"
    result = quantune.tune(make_config(), output=out)
    page = (out / "report.html").read_text()  # written by the run itself
    for div in PLOTS:
        assert f'id="{div}"' in page
    assert not re.search(r"<script[^>]*\bsrc=", page)  # nothing loaded from elsewhere: plotly.js is inlined
    assert "Plotly.newPlot" in page and len(page) > 1_000_000
    # each figure carries plotly's plotly_white theme, added as JSON as the page is written
    import plotly.io as pio

    white = json.dumps(pio.templates["plotly_white"].to_plotly_json()["layout"]["plot_bgcolor"])
    assert '"template":{}' not in page and page.count(f'"plot_bgcolor":{white}') >= len(PLOTS)
    assert _rows(page) == [t.number for t in result.trials]
    assert f'<tr class="best" data-state="meets"><td data-v="{float(result.best.number)!r}">' in page
    results = json.loads((out / "results.json").read_text())
    env = results["environment"]
    assert env["versions"]["onnxruntime"] and env["versions"]["onnx"] and env["versions"]["quantune"]
    assert env["logical_cores"] >= 1 and "cpu_flags" in env
    assert env["cpu_model"] in page and env["versions"]["onnxruntime"] in page


def test_optuna_load_study_opens_the_run_with_its_trials(make_config, tmp_path):
    out = tmp_path / "out"
    config = make_config(
        passes=[{"name": "static_quant", "search": True}],
        search={"sampler": "random", "seed": 0},
        stop={"max_trials": 5},
    )
    result = quantune.tune(config, output=out)
    study = load_run_study(out)
    assert [t.user_attrs["quantune_trial"] for t in study.trials] == [t.number for t in result.trials]
    for frozen, record in zip(study.trials, result.trials, strict=True):
        if record.status == "ok":
            assert frozen.state == optuna.trial.TrialState.COMPLETE
            assert frozen.values[0] == pytest.approx(record.metrics["latency_ms"])
            assert frozen.values[1] == pytest.approx(record.accuracy_loss)
        else:
            assert frozen.state == optuna.trial.TrialState.FAIL
        # quantune's parameters, as the Optuna samplers name and distribute them
        searched = {k.split("|")[0]: v for k, v in frozen.params.items()}
        assert searched["static_quant.quant_format"] == record.params["static_quant.quant_format"]
        assert isinstance(
            frozen.distributions["static_quant.quant_format"], optuna.distributions.CategoricalDistribution
        )
    assert study.metric_names == ["latency (ms)", "accuracy loss"]


def test_optuna_dashboard_serves_the_run(make_config, tmp_path):
    dashboard = pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is not installed (optional)")
    out = tmp_path / "out"
    result = quantune.tune(make_config(), output=out)
    app = dashboard.wsgi(journal_storage(out / STUDY_FILE))

    def get(path: str, query: str = "") -> dict:
        answer: dict[str, str] = {}

        def start_response(status, headers, exc_info=None):
            answer["status"] = status

        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query, "wsgi.input": io.BytesIO()}
        body = b"".join(app(environ, start_response))
        assert answer["status"].startswith("200"), body[:300]
        return json.loads(body)

    studies = get("/api/studies")["study_summaries"]
    assert [s["study_name"] for s in studies] == [STUDY_NAME]
    detail = get(f"/api/studies/{studies[0]['study_id']}", "after=0")
    assert len(detail["trials"]) == len(result.trials)
    assert detail["objective_names"] == ["latency (ms)", "accuracy loss"]


def test_report_of_a_run_where_nothing_met_the_budget(make_config, tmp_path):
    config = make_config(
        passes=[{"name": "static_quant", "params": {"activation_type": "int8", "calibration_samples": 2}}],
        criterion={"type": "absolute", "tolerable_loss": 0.0, "higher_is_better": True},
        evaluation={"metric": "cosine", "latency": {"warmup": 0, "repeats": 2}},
    )
    result = quantune.tune(config, output=tmp_path / "out")
    assert result.best is None and result.closest_miss is not None
    page = quantune.write_report(tmp_path / "out", tmp_path / "elsewhere.html").read_text()
    assert "no trial met the accuracy budget" in page
    assert f"closest miss: trial {result.closest_miss.number}" in page
    assert "precision map of the closest miss" in page
    for div in PLOTS:
        assert f'id="{div}"' in page


def test_failed_trials_are_in_the_table_and_the_plots_with_their_class(make_config, tmp_path):
    quantune.tune(make_config(), output=tmp_path / "out")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    results["trials"][0].update(status="failed", error="boom", metrics={}, failure_class="evaluation: ValueError: boom")
    results["trials"][0]["accuracy_loss"] = None
    page = render_html(results, tmp_path / "out")
    assert 'data-state="failed"' in page
    assert "failed: evaluation: ValueError: boom" in page  # the table
    assert "FAILED: evaluation: ValueError: boom" in page  # the plots' hover text


def test_report_escapes_what_came_from_trials(make_config, tmp_path):
    quantune.tune(make_config(), output=tmp_path / "out")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    results["trials"][0].update(status="failed", error="<script>alert(1)</script>", metrics={})
    results["trials"][0]["params"] = {"x.y": "<b>bold</b>"}
    page = render_html(results, tmp_path / "out")
    assert "<script>alert(1)" not in page and "<b>bold</b>" not in page
    assert "&lt;script&gt;alert(1)" in page


def test_report_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no results.json" in err[0]
    (tmp_path / "results.json").write_text("{broken")
    assert main(["report", str(tmp_path)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_report_cli_needs_only_results_json(make_config, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("QUANTUNE_REPORT", "0")
    quantune.tune(make_config(), output=tmp_path / "out")
    assert not (tmp_path / "out" / "report.html").exists()  # QUANTUNE_REPORT=0 skips the end-of-run page
    shutil.rmtree(tmp_path / "cache")
    shutil.rmtree(tmp_path / "out" / "best", ignore_errors=True)
    assert main(["report", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed.endswith("report.html")
    page = (tmp_path / "out" / "report.html").read_text()
    assert "no longer on disk" in page and "class=gone" in page


def test_a_run_of_few_finished_trials_writes_its_study_without_parameter_views(make_config, tmp_path):
    """Two to four finished trials: the study is written (optuna-dashboard opens it), the parameter
    views are not drawn (an importance over three points says nothing, and Optuna's plotting and
    importance imports took 1.9 s of a 4.6 s run); the page says why."""
    out = tmp_path / "out"
    config = make_config(passes=[{"name": "static_quant", "search": True}], stop={"max_trials": 3})
    result = quantune.tune(config, output=out)
    assert 2 <= len([t for t in result.trials if t.status == "ok"]) < VIEW_TRIALS
    page = (out / "report.html").read_text()
    assert (out / STUDY_FILE).exists()
    assert f"No parameter view: fewer than {VIEW_TRIALS} finished trials." in page
    assert 'id="plot-importance-objective"' not in page and 'id="plot-trade-off"' in page


def test_a_run_of_one_finished_trial_writes_no_study_and_says_why(make_config, tmp_path):
    """With fewer than two finished trials there is nothing to view: Optuna's plots are not imported
    and no optuna.journal is written; the page says so."""
    out = tmp_path / "out"
    config = make_config(passes=[{"name": "static_quant", "search": True}], stop={"max_trials": 1})
    result = quantune.tune(config, output=out)
    assert len([t for t in result.trials if t.status == "ok"]) == 1
    page = (out / "report.html").read_text()
    assert not (out / STUDY_FILE).exists()
    assert "No Optuna study written (fewer than two finished trials)" in page
    assert "No parameter view: fewer than two finished trials." in page
