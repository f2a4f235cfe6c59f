"""A metric that gives NaN for a candidate fails that trial, with the reason; it never crashes the run."""

from __future__ import annotations

import math

import quantune
from quantune import Categorical, Feedback, SearchSpace, create_sampler
from robust_helpers import metric_for_candidates

# NaN for every model but the one it first saw (the original: the preflight and the baseline
# evaluate it first, and its outputs do not change between runs)
NAN_METRIC = metric_for_candidates('return float("nan")')


def test_a_nan_violation_is_told_to_optuna_as_a_failure():
    sampler = create_sampler("tpe", seed=0)
    sampler.bind(SearchSpace({"a": Categorical((1, 2, 3))}))
    first = sampler.ask()
    sampler.tell(first, Feedback(1.0, violation=0.0))
    second = sampler.ask()
    sampler.tell(second, Feedback(2.0, violation=math.nan))  # Optuna: "NaN is not allowed" before
    assert sampler.ask() is not None


def test_a_metric_giving_nan_on_candidates_fails_those_trials_with_the_reason(make_config, tmp_path):
    (tmp_path / "metric.py").write_text(NAN_METRIC)
    metric = f"{tmp_path / 'metric.py'}:score"
    config = make_config(
        [{"name": "dynamic_quant", "params": {"weight_type": {"search": ["int8", "uint8"]}}}],
        evaluation={"metric": metric, "latency": {"repeats": 3}},
        search={"sampler": "tpe", "seed": 0},
        stop={"max_trials": 3},
    )
    result = quantune.tune(config, output=tmp_path / "out")
    assert result.baseline[metric] == 1.0
    assert result.trials and all(t.status == "failed" for t in result.trials)
    assert all(f"metric '{metric}' returned NaN" in (t.error or "") for t in result.trials)
    assert result.verdict == "no_candidate_in_budget"
