"""The speed-first strategy knows providers: every provider's ceilings before any accuracy work.

Real parts only: the plans are the engine's own (the provider step lists providers; nothing
runs on one for the plan tests), and the run on OpenVINO uses the real target environment
(``target_env.py``), skipped with its reason where it cannot be made. No provider is faked.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import quantune
from quantune.config import load_config
from quantune.engine.plan.plan import build_plan
from quantune.strategy.accuracy.latency_stage import LatencyStage
from quantune.strategy.accuracy.provider_ceilings import ProviderCeilings, on_providers, original_points
from quantune.strategy.accuracy.shared import Shared
from quantune.strategy.base import Outcome, SearchProblem
from quantune.strategy.options import QuantuneOptions

CPU, OV = "CPUExecutionProvider", "OpenVINOExecutionProvider"


def axis_problem(make_config, providers: list[str]) -> SearchProblem:
    """The strategy's view of a plan whose provider step searches ``providers``, as the engine builds it."""
    passes = [
        {"name": "static_quant", "params": {"quant_format": {"search": ["QDQ", "QOperator"]}, "per_channel": False}},
        {"name": "dynamic_quant"},
        {"name": "execution_provider", "id": "provider", "params": {"provider": {"search": providers}}},
    ]
    config = make_config(passes, flows=[["static_quant"], ["dynamic_quant"]])
    plan = build_plan(load_config(config).config)
    return SearchProblem(
        space=plan.space,
        flows=plan.flows,
        subspace=plan.subspace,
        make_sampler=lambda: None,  # type: ignore[arg-type,return-value]
        step_passes={sid: step.pass_cls.name for sid, step in plan.steps.items()},
        step_fixed={sid: dict(step.fixed) for sid, step in plan.steps.items()},
    )


def test_each_variant_gets_a_ceiling_on_every_provider_that_loads_it(make_config) -> None:
    problem = axis_problem(make_config, [CPU, OV])
    qdq = {"flow": "static_quant>provider", "static_quant.quant_format": "QDQ"}
    qop = {"flow": "static_quant>provider", "static_quant.quant_format": "QOperator"}
    dyn = {"flow": "dynamic_quant>provider"}
    placed = on_providers(problem, [(qdq, "QDQ"), (qop, "QOperator"), (dyn, "dynamic")])
    assert [label for _, label in placed] == [
        "QDQ on CPU",
        "QDQ on OpenVINO",
        "QOperator on CPU",  # QOperator does not load on OpenVINO, dynamic runs on the CPU provider only
        "dynamic on CPU",
    ]
    assert placed[1][0] == {**qdq, "provider.provider": OV}
    # the originals timed beside them: on every provider but the reference one
    assert original_points(problem) == [(OV, {"provider.provider": OV, "flow": "provider"}, ("provider",))]


def test_one_provider_leaves_the_ceilings_as_they_were(make_config) -> None:
    problem = axis_problem(make_config, [CPU])
    variants = [({"flow": "static_quant>provider"}, "defaults")]
    assert on_providers(problem, variants) == variants and original_points(problem) == []


def rule_of(problem: SearchProblem) -> ProviderCeilings:
    """The stage's rule alone, on ratios as the ceilings' side-by-side session reports them; of its
    strategy it reads the problem only (the options: the strategy's defaults, drop_slow: true)."""
    shared = Shared(SimpleNamespace(problem=problem), QuantuneOptions(), recover=None)  # type: ignore[arg-type]
    return ProviderCeilings(shared, LatencyStage(shared))


def test_a_ceiling_an_original_in_budget_beats_cannot_win(make_config) -> None:
    rule = rule_of(axis_problem(make_config, [CPU, OV]))
    rule.original_items()
    rule.note_originals([0.6])  # the original on OpenVINO, side by side with the original on the CPU
    assert rule.beaten_by_original(0.7, 0.03) is None  # not known in budget yet: no ceiling is dropped
    rule.observe_opening(OV, Outcome({"top1": 1.0}, meets=True))
    assert rule.best_original() == (OV, 0.6)
    why = rule.beaten_by_original(0.7, 0.03)
    assert why is not None and "original on OpenVINO is in budget at 0.60x" in why
    assert rule.beaten_by_original(0.5, 0.03) is None  # a win is still possible there: it is recovered


def test_an_original_out_of_budget_or_slower_drops_nothing(make_config) -> None:
    rule = rule_of(axis_problem(make_config, [CPU, OV]))
    rule.original_items()
    rule.note_originals([0.6])
    rule.observe_opening(OV, Outcome({"top1": 0.1}, meets=False))  # OpenVINO scored it lower
    assert rule.best_original() is None and rule.beaten_by_original(0.9, 0.03) is None
    rule.observe_opening(OV, Outcome({"top1": 1.0}, meets=True))
    rule.note_originals([1.2])  # in budget, but slower than the original where it runs now
    assert rule.best_original() is None


def test_the_quantune_strategy_times_ceilings_per_provider(make_config, tmp_path: Path, ov_python: Path) -> None:
    """In the OpenVINO environment: the ceiling stage times each variant on each provider that
    loads it and the original on OpenVINO, in one session, before any recovery; every ceiling
    decision names its provider, and a dropped one says what beat it."""
    passes = [{"name": "static_quant", "params": {"quant_format": {"search": ["QDQ", "QOperator"]}}}]
    config: dict[str, Any] = make_config(passes)
    config["search"] = {"strategy": "quantune", "seed": 0}
    config["stop"] = {"max_trials": 4}
    config["evaluation"]["latency"]["confirm_top"] = 0
    config["target"] = {"python": str(ov_python), "providers": [CPU, OV]}
    result = quantune.tune(config, tmp_path / "run")
    recorded = json.loads((tmp_path / "run" / "results.json").read_text())
    strategy = recorded["strategy"]
    decisions = strategy["decisions"]
    assert any(" on OpenVINO " in line for line in decisions) and any(" on CPU " in line for line in decisions)
    assert not any("QOperator" in line and "on OpenVINO" in line for line in decisions)  # pruned, never timed
    ratios = strategy.get("provider_original_ratios", {})
    assert set(ratios) <= {OV}
    for record in result.trials:  # each trial measured where its point says it runs
        provider = record.params.get("provider.provider", CPU)
        assert (record.session_settings or {}).get("provider", CPU) == provider
    for line in decisions:
        if "original on OpenVINO is in budget" in line:
            assert "dropped" in line


def test_the_openings_paired_ratio_stands_until_the_ceilings_time_it(make_config) -> None:
    rule = rule_of(axis_problem(make_config, [CPU, OV]))
    rule.observe_opening(OV, Outcome({"top1": 1.0}, meets=True), 0.8)  # timed by its opening
    assert rule.best_original() == (OV, 0.8)
    rule.original_items()
    rule.note_originals([None])  # not timed in the ceilings' session (its share ran out): the opening's stands
    assert rule.best_original() == (OV, 0.8)
    rule.note_originals([0.7])  # timed with the ceilings, side by side with them
    assert rule.best_original() == (OV, 0.7)
