"""report.html: one self-contained page per run, built from results.json alone."""

from __future__ import annotations

import base64
import json
import re
import shutil

import quantune
from quantune.cli import main
from quantune.report.html import render_html

PNG = b"\x89PNG\r\n\x1a\n"


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(data) for data in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


def test_report_of_a_run_has_both_plots_every_trial_and_the_best(make_config, tmp_path):
    out = tmp_path / "out"
    result = quantune.tune(make_config(), output=out)
    page_path = quantune.write_report(out)
    assert page_path == out / "report.html"
    page = page_path.read_text()
    images = _images(page)
    assert len(images) == 2 and all(image.startswith(PNG) for image in images)
    rows = re.findall(r"<tr(?: class=\"\w+\")?><td>(\d+)</td>", page)
    assert sorted(map(int, rows)) == [t.number for t in result.trials]
    assert f'<tr class="best"><td>{result.best.number}</td>' in page
    assert f"best: trial {result.best.number}" in page


def test_report_of_a_run_where_nothing_met_the_budget(make_config, tmp_path):
    config = make_config(
        passes=[{"name": "static_quant", "params": {"activation_type": "int8", "calibration_samples": 2}}],
        criterion={"type": "absolute", "tolerable_loss": 0.0, "higher_is_better": True},
        evaluation={"metric": "cosine", "latency": {"warmup": 0, "repeats": 2}},
    )
    result = quantune.tune(config, output=tmp_path / "out")
    assert result.best is None
    page = quantune.write_report(tmp_path / "out", tmp_path / "elsewhere.html").read_text()
    assert "no trial met the criterion" in page
    assert len(_images(page)) == 2


def test_report_escapes_what_came_from_trials(make_config, tmp_path):
    quantune.tune(make_config(), output=tmp_path / "out")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    results["trials"][0].update(status="failed", error="<script>alert(1)</script>", metrics={})
    results["trials"][0]["params"] = {"x.y": "<b>bold</b>"}
    page = render_html(results)
    assert "<script>" not in page and "<b>bold</b>" not in page
    assert "&lt;script&gt;" in page


def test_report_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no results.json" in err[0]
    (tmp_path / "results.json").write_text("{broken")
    assert main(["report", str(tmp_path)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_report_cli_writes_the_page_and_prints_its_path(make_config, tmp_path, capsys):
    quantune.tune(make_config(), output=tmp_path / "out")
    shutil.rmtree(tmp_path / "cache")  # the report needs results.json only
    assert main(["report", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed.endswith("report.html") and (tmp_path / "out" / "report.html").is_file()
