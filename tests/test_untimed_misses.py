"""A fallback trial whose accuracy cannot change the answer is not timed.

A trial of the recovery stages (bisection, prune, op types added back) that misses the budget is
not timed during the search (its latency and memory probe cost about twice its evaluation on a
small batch): with a candidate in budget it can be neither the best nor the closest miss; without
one, the misses that may be the closest miss are timed at the run's end, the most accurate first.
Its record says why, the verdict and the final model stay those of a run that times everything,
and a later trial that needs the figures of such a model (in budget under another criterion)
times it from the cache.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import quantune
from quantune.engine.run.loop import RunLoop
from quantune.engine.trials.selection import miss_front
from quantune.store import RunStore
from test_accuracy_strategies import scaled_config


def _config(tmp_path: Path, tolerable_loss: float = 0.0) -> dict[str, Any]:
    """The scaled CNN straight to the bisection (no targeted fix, no screen, no latency stage); with no
    loss allowed, both scaled convs must stay in fp32 (k=2 meets, k=1 misses). The objective is size
    and the variant one: the verdict and the final model then rest on no timing, so two runs can be
    compared exactly."""
    config = scaled_config(tmp_path, "quantune", max_trials=20)
    config["search"]["strategy_options"].update(targeted_units=0, screen_trials=0, latency_trials=0)
    config["criterion"]["tolerable_loss"] = tolerable_loss
    config["objective"] = "size"
    # one variant: which ceiling is recovered in follows their timing, which two runs need not share
    config["passes"][0]["params"].update(quant_format="QDQ", activation_type="uint8")
    return config


def _trials(output: Path) -> list[dict[str, Any]]:
    return json.loads((output / "results.json").read_text())["trials"]


def test_misses_after_a_candidate_in_budget_are_not_timed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = quantune.tune(_config(tmp_path), output=tmp_path / "run")
    trials = _trials(tmp_path / "run")
    first = min(t["number"] for t in trials if t["meets_criterion"] and t["metrics"]["quantized_ops"] > 0)
    untimed = [t for t in trials if t["untimed"]]
    assert any(t["stage"].startswith("bisect") for t in untimed), [(t["stage"], t["untimed"]) for t in trials]
    for trial in trials:
        timed = "latency_ms" in trial["metrics"] and "peak_memory_mb" in trial["metrics"]
        if trial["untimed"]:  # a miss after the first candidate, its figures absent, the reason given
            assert not trial["meets_criterion"] and trial["number"] > first and not timed
            assert trial["objective"] == trial["metrics"]["size_bytes"]  # a size run: its objective is known
            assert "closest miss" in trial["untimed"]
        else:
            assert timed, trial
        if trial["meets_criterion"] or trial["number"] < first:  # candidates, and misses before any
            assert not trial["untimed"]
    stored = {row["number"]: row for row in RunStore(tmp_path / "run" / "run.db").trials()}
    assert {n for n, row in stored.items() if row.get("untimed")} == {t["number"] for t in untimed}

    # the same run timing every trial (a cache of its own): the same trials, verdict and final model
    monkeypatch.setattr(RunLoop, "untimed_misses", False)
    other = tmp_path / "every"
    every = quantune.tune(_config(other), output=other / "run")
    assert not any(t.untimed for t in every.trials)
    assert all("latency_ms" in t.metrics for t in every.trials)
    assert [(t.stage, t.params) for t in every.trials] == [(t.stage, t.params) for t in result.trials]
    assert every.verdict == result.verdict
    assert every.best is not None and result.best is not None
    assert every.best.model_sha256 == result.best.model_sha256


def test_an_untimed_model_is_timed_when_a_later_trial_needs_it(tmp_path: Path) -> None:
    quantune.tune(_config(tmp_path), output=tmp_path / "strict")
    missed = [t for t in _trials(tmp_path / "strict") if t["untimed"]]
    assert missed
    # the same cache, a looser budget: those models are in budget now, read from the cache and timed
    quantune.tune(_config(tmp_path, tolerable_loss=0.01), output=tmp_path / "loose")
    again = {t["model_sha256"]: t for t in _trials(tmp_path / "loose")}
    reused = [again[t["model_sha256"]] for t in missed if t["model_sha256"] in again]
    assert any(t["meets_criterion"] and t["cache"]["evaluation"] == "hit" for t in reused), reused
    for trial in reused:
        if trial["meets_criterion"]:
            assert not trial["untimed"] and "latency_ms" in trial["metrics"]


def test_without_a_candidate_only_the_misses_that_may_be_the_closest_miss_are_timed(tmp_path: Path) -> None:
    config = _config(tmp_path)
    config["evaluation"]["metric"] = "cosine"  # no loss allowed: every quantized model misses
    config["objective"] = "latency"
    result = quantune.tune(config, output=tmp_path / "run")
    assert result.verdict == "no_candidate_in_budget" and result.closest_miss is not None
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    trials = {t["number"]: t for t in saved["trials"]}
    recovery = [t for t in trials.values() if t["stage"].startswith(("bisect", "prune"))]
    assert recovery  # the bisection ran, and its misses were timed at the end only where needed
    assert "closest miss" in saved["time_spent_s"]
    closest = trials[saved["closest_miss"]["number"]]
    assert not closest["untimed"] and "latency_ms" in closest["metrics"]
    front = miss_front(result.trials, result.baseline["latency_ms"])
    assert front and front[0].number == closest["number"]
    for trial in trials.values():  # each left untimed is less accurate than the closest miss (faster)
        if trial["untimed"]:
            assert trial["accuracy_loss"] > closest["accuracy_loss"] and "latency_ms" not in trial["metrics"]
    stored = {row["number"]: row for row in RunStore(tmp_path / "run" / "run.db").trials()}
    assert {n for n, row in stored.items() if row.get("untimed")} == {n for n, t in trials.items() if t["untimed"]}
