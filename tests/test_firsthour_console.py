"""Issue 26 (item 11): what a first run shows -- no Optuna warning blocks above the results
table, and a heading that says the trial count the way a person would."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from conftest import INLINE_EXECUTOR
from quantune.cli import main
from quantune.report.console import heading


def _result(stages: list[str], reason: str) -> SimpleNamespace:
    return SimpleNamespace(trials=[SimpleNamespace(stage=stage) for stage in stages], stop_reason=reason)


def test_the_heading_counts_as_max_trials_counts():
    """17 rows with max_trials 16 read as a miscount: one trial made an earlier trial's model."""
    stages = ["joint"] * 16 + ["joint (duplicate of trial 3)"]
    text = heading(_result(stages, "max_trials (16) reached"))
    assert text.startswith("quantune: 16 trials + 1 that made an earlier trial's model again (not counted)")
    assert "stopped: the 16-trial limit (stop.max_trials) was reached" in text
    assert "max_trials (16)" not in text


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        ("timeout (30 s) reached", "stopped: the time limit of 30 s (stop.timeout_s) was reached"),
        ("search finished (space exhausted or strategy done)", "stopped: every setting to try was tried"),
        ("a trial met the criterion (stop_when_met)", "stopped: a trial met the criterion (stop_when_met)"),
    ],
)
def test_the_heading_says_why_the_search_stopped(reason, words):
    text = heading(_result(["joint"], reason))
    assert text == f"quantune: 1 trial; {words}"


def test_a_first_run_without_scikit_learn_shows_no_optuna_warnings(tmp_path, cnn_model, cnn_data, monkeypatch):
    """A fresh install has no scikit-learn, so the report's importance view uses Optuna's
    PED-ANOVA, which warned three times (UserWarning) while the page was drawn -- above the table."""
    pytest.importorskip("plotly")
    config = {
        "model": str(cnn_model),
        "data": {"calibration": str(cnn_data["calibration"]), "evaluation": str(cnn_data["evaluation"])},
        "evaluation": {"metric": "top1", "latency": {"warmup": 0, "repeats": 2, "confirm_top": 0}},
        "criterion": {"type": "absolute", "tolerable_loss": 1.0},
        "passes": [{"name": "static_quant", "params": {"quant_format": {"search": ["QDQ", "QOperator"]}}}],
        "search": {"sampler": "exhaustive"},
        "stop": {"max_trials": 2},
        "cache_dir": str(tmp_path / "cache"),
        **INLINE_EXECUTOR,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", str(path), "-o", str(tmp_path / "out"), "-q"]) == 0
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "sklearn" else find_spec(name, *a)
    )
    from quantune.report.html import write_report

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write_report(Path(tmp_path / "out"))
    optuna = [w for w in caught if "optuna" in str(w.filename) or "optuna" in str(w.message).lower()]
    assert not optuna, [str(w.message) for w in optuna]
