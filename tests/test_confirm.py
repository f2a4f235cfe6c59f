"""A latency run ends by timing its best models again beside the original, and chooses on that."""

from __future__ import annotations

import json

import pytest

import quantune
from quantune.evaluate import LatencySpec, measure_side_by_side

WEIGHT_TYPES = [{"name": "dynamic_quant", "params": {"weight_type": {"search": ["int8", "uint8"]}}}]


def _results(out) -> dict:
    return json.loads((out / "results.json").read_text())


def test_the_top_models_are_retimed_with_the_original_and_the_best_is_among_them(make_config, tmp_path):
    config = make_config(
        passes=[
            {"name": "graph_opt", "params": {"level": {"search": ["basic", "extended"]}}},
            *WEIGHT_TYPES,
        ],
        evaluation={"metric": "top1", "latency": {"warmup": 1, "repeats": 5, "threads": 1, "confirm_top": 1}},
    )
    result = quantune.tune(config, output=tmp_path / "out")
    results = _results(tmp_path / "out")
    confirmation = results["latency_confirmation"]
    feasible = [t for t in results["trials"] if t["meets_criterion"]]
    assert len(feasible) == 4
    confirmed = [t for t in feasible if t["number"] in confirmation["trials"]]
    # confirm_top 1: one model (several trials may have made the same one), the search's fastest
    assert len({t["model_path"] for t in confirmed}) == 1
    search_fastest = min(
        t["metrics"]["latency_search_ms"] if t in confirmed else t["metrics"]["latency_ms"] for t in feasible
    )
    assert confirmed[0]["metrics"]["latency_search_ms"] == search_fastest
    assert results["best"]["number"] in confirmation["trials"]
    assert result.best.metrics["latency_ms"] == confirmed[0]["metrics"]["latency_ms"]
    assert results["baseline"]["latency_search_ms"] == confirmation["baseline_search_ms"]
    # the run store keeps what the search measured
    assert all("latency_search_ms" not in t["metrics"] for t in feasible if t not in confirmed)


@pytest.mark.parametrize(
    "overrides",
    [
        {"evaluation": {"metric": "top1", "latency": {"warmup": 1, "repeats": 3, "confirm_top": 0}}},
        {"objective": "size"},
        {"criterion": {"type": "absolute", "tolerable_loss": 0.0, "higher_is_better": True}, "passes": []},
    ],
    ids=["turned-off", "size-objective", "nothing-meets"],
)
def test_no_confirmation_when_off_or_not_about_latency_or_nothing_met(make_config, tmp_path, overrides):
    passes = overrides.pop("passes", WEIGHT_TYPES) or [
        {"name": "static_quant", "params": {"activation_type": "int8", "calibration_samples": 2}}
    ]
    config = make_config(passes=passes, **overrides)
    result = quantune.tune(config, output=tmp_path / "out")
    assert _results(tmp_path / "out")["latency_confirmation"] is None
    assert result.latency_confirmation is None
    assert "latency_search_ms" not in result.baseline


def test_measure_side_by_side_times_every_model(cnn_model, mlp_model):
    import numpy as np

    from conftest import cnn_inputs

    feeds = {"input": cnn_inputs(4, seed=0)}
    figures = measure_side_by_side([cnn_model, cnn_model], feeds, LatencySpec(warmup=1, repeats=4, threads=1))
    assert len(figures) == 2
    for item in figures:
        assert set(item) == {"latency_ms", "latency_p90_ms", "latency_mean_ms"}
        assert 0 < item["latency_ms"] <= item["latency_p90_ms"]
        assert np.isfinite(item["latency_mean_ms"])


def test_the_run_store_keeps_search_figures_and_a_resumed_run_confirms_again(make_config, tmp_path):
    config = make_config(passes=WEIGHT_TYPES)
    first = quantune.tune(config, output=tmp_path / "out")
    second = quantune.tune(config, output=tmp_path / "out")  # resumes: every trial replayed
    assert second.replayed == len(first.trials) == 2
    for before, after in zip(first.trials, second.trials, strict=True):
        assert after.metrics["latency_search_ms"] == before.metrics["latency_search_ms"]
    assert second.latency_confirmation is not None


def test_retiming_rounds_fit_the_budget_but_never_drop_below_five():
    from quantune.engine.measure.confirm import timing_rounds

    assert timing_rounds(10, 50, round_s=0.01, budget_s=3.0) == (2, 50)  # small model: all rounds
    assert timing_rounds(10, 50, round_s=1.5, budget_s=15.0) == (2, 8)  # MiniLM-sized: what fits
    assert timing_rounds(10, 50, round_s=60.0, budget_s=3.0) == (2, 5)  # huge: the floor
    assert timing_rounds(1, 3, round_s=0.01, budget_s=None) == (1, 3)
