"""Several flows sharing work, execution orders (pass-by-pass with backtracking, chains),
Pareto fronts, and pruning by target provider."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

import quantune
from quantune.config import Config
from quantune.engine.plan.plan import build_plan
from quantune.engine.trials.selection import pareto_front
from quantune.engine.trials.trial import TrialRecord
from quantune.search import create_sampler
from quantune.space import Categorical, SearchSpace
from quantune.strategy import WAIT, Outcome, SearchProblem, create_strategy

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_six_flows_example_runs_pass_one_once_and_tries_every_flow(tmp_path: Path) -> None:
    raw = yaml.safe_load((EXAMPLES / "six_flows" / "config.yaml").read_text())
    base = EXAMPLES / "six_flows"
    raw["model"] = str((base / raw["model"]).resolve())
    raw["data"] = {**raw["data"], **{k: str((base / raw["data"][k]).resolve()) for k in ("calibration", "evaluation")}}
    raw["evaluation"]["latency"] = {"warmup": 0, "repeats": 2, "threads": 1}
    raw["executor"] = {"kind": "inline"}
    raw["cache_dir"] = str(tmp_path / "cache")
    result = quantune.tune(raw, output=tmp_path / "out")
    flows = {">".join(t.flow) for t in result.trials}
    assert flows == {
        "fold>dynamic>ort_opt", "fold>qdq_conv>ort_opt", "fold>qdq_conv>dyn_fc",
        "fold>qop_conv>ort_opt", "fold>qop_conv>dyn_fc", "fold>ort_opt",
    }  # fmt: skip
    assert len(result.trials) == 9 + 3 + 1 + 6 + 2 + 3
    assert result.cache_stats["fold"] == {"hits": 23, "misses": 1}
    # The shared prefix fold>qdq_conv also ran once for the four trials that start with it.
    assert result.cache_stats["qdq_conv"] == {"hits": 3, "misses": 1}
    assert all(t.status == "ok" for t in result.trials)


def _problem(groups: list[list[str]] | None, flow: tuple[str, ...], values: dict[str, list[str]], **extra: Any):
    def subspace(step_ids: list[str], fixed: dict[str, Any]) -> SearchSpace:
        return SearchSpace({f"{s}.x": Categorical(tuple(values[s])) for s in step_ids if f"{s}.x" not in fixed})

    return SearchProblem(
        space=subspace(list(flow), {}),
        flows={">".join(flow): flow},
        subspace=subspace,
        make_sampler=lambda: create_sampler("exhaustive"),
        groups=groups,
        **extra,
    )


def _drive(strategy, judge) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """Runs the strategy to the end, one trial at a time; returns (flow, point) in order."""
    seen = []
    while True:
        proposal = strategy.ask()
        assert proposal is not WAIT, "one trial at a time never has to wait"
        if proposal is None:
            return seen
        seen.append((proposal.flow, proposal.point))
        meets, objective = judge(proposal.flow, proposal.point)
        strategy.tell(proposal, Outcome(objective, 0.0 if meets else 1.0, meets))


def test_pass_by_pass_continues_from_the_best_and_backtracks() -> None:
    problem = _problem(None, ("A", "B"), {"A": ["a1", "a2", "a3"], "B": ["b1", "b2"]}, keep_best=2)
    strategy = create_strategy("pass-by-pass")
    strategy.bind(problem)
    objective = {"a1": 1.0, "a2": 2.0, "a3": 3.0}

    def judge(flow, point):
        if flow == ("A",):
            return True, objective[point["A.x"]]
        # Nothing after a1 meets the criterion; after a2, b2 does.
        return point["A.x"] == "a2" and point["B.x"] == "b2", 0.5

    seen = _drive(strategy, judge)
    assert [flow for flow, _ in seen] == [("A",)] * 3 + [("A", "B")] * 4
    assert [p["A.x"] for flow, p in seen if flow == ("A", "B")] == ["a1", "a1", "a2", "a2"]
    assert {p["B.x"] for flow, p in seen[3:5]} == {"b1", "b2"}


def test_pass_by_pass_gives_up_when_no_kept_output_leads_anywhere() -> None:
    problem = _problem(None, ("A", "B"), {"A": ["a1", "a2"], "B": ["b1"]}, keep_best=2)
    strategy = create_strategy("pass-by-pass")
    strategy.bind(problem)
    seen = _drive(strategy, lambda flow, point: (flow == ("A",), 1.0))
    assert [flow for flow, _ in seen] == [("A",), ("A",), ("A", "B"), ("A", "B")]


def test_chain_searches_groups_jointly_in_order() -> None:
    problem = _problem([["A"], ["B", "C"]], ("A", "B", "C"), {"A": ["a1", "a2"], "B": ["b1", "b2"], "C": ["c1", "c2"]})
    strategy = create_strategy("chain")
    strategy.bind(problem)
    seen = _drive(strategy, lambda flow, point: (True, 1.0 if point.get("A.x") == "a2" else 2.0))
    assert [flow for flow, _ in seen] == [("A",)] * 2 + [("A", "B", "C")] * 4
    assert all(p["A.x"] == "a2" for flow, p in seen[2:]), "the second group starts from the best of the first"
    assert {(p["B.x"], p["C.x"]) for _, p in seen[2:]} == set(itertools.product(["b1", "b2"], ["c1", "c2"]))


def test_chain_needs_groups() -> None:
    strategy = create_strategy("chain")
    with pytest.raises(quantune.QuantuneError, match="groups"):
        strategy.bind(_problem(None, ("A",), {"A": ["a"]}))


def _record(number: int, latency: float, size: float, loss: float, meets: bool = True) -> TrialRecord:
    return TrialRecord(
        number, ["s"], {}, "ok", metrics={"latency_ms": latency, "size_bytes": size}, meets_criterion=meets,
        accuracy_loss=loss,
    )  # fmt: skip


def test_pareto_front_matches_brute_force() -> None:
    rng = random.Random(0)
    records = [
        _record(i, rng.choice([1.0, 2.0, 3.0]), rng.choice([10.0, 20.0, 30.0]), rng.random() / 100, meets=i % 7 != 0)
        for i in range(60)
    ]
    objectives = ["latency", "size", "accuracy"]
    front = {r.number for r in pareto_front(records, objectives)}
    feasible = [r for r in records if r.meets_criterion]

    def values(r: TrialRecord) -> tuple[float, ...]:
        return (r.metrics["latency_ms"], r.metrics["size_bytes"], r.accuracy_loss)

    expected = {
        r.number
        for r in feasible
        if not any(
            all(a <= b for a, b in zip(values(o), values(r), strict=True)) and values(o) != values(r) for o in feasible
        )
    }
    assert front == expected and front
    assert not any(r.number in front for r in records if not r.meets_criterion)


def test_multi_objective_run_reports_its_pareto_front(make_config, tmp_path: Path) -> None:
    config = make_config(
        passes=[{"name": "static_quant", "params": {"quant_format": {"search": ["QDQ", "QOperator"]},
                                                    "per_channel": {"search": [False, True]}}}],
        objectives=["size", "latency"],
        executor={"kind": "inline"},
    )  # fmt: skip
    result = quantune.tune(config, output=tmp_path / "out")
    assert result.pareto_front
    assert set(result.pareto_front) == {r.number for r in pareto_front(result.trials, ["size", "latency"])}
    smallest = min(r.metrics["size_bytes"] for r in result.trials if r.meets_criterion)
    assert result.best.metrics["size_bytes"] == smallest, "the best follows the declared order: size first"


def _plan(provider: str):
    config = Config.model_validate(
        {
            "model": "unused.onnx",
            "data": {"evaluation": "unused.npz"},
            "passes": [
                {"id": "dyn", "name": "dynamic_quant"},
                {"id": "st", "name": "static_quant", "search": True},
            ],
            "flows": [["dyn"], ["st"]],
            "target": {"provider": provider},
        }
    )
    return build_plan(config)


def test_target_provider_prunes_flows_and_values() -> None:
    cpu = _plan("CPUExecutionProvider")
    assert set(cpu.flows) == {"dyn", "st"}
    trt = _plan("TensorrtExecutionProvider")
    assert set(trt.flows) == {"st"}, "dynamic quantization has CPU kernels only"
    configs = [trt.configs_for(p)[0][1] for p in trt.space.iterate()]
    assert configs and all(c.quant_format == "QDQ" and c.activation_type == "int8" for c in configs)
    assert all(c.activation_symmetric for c in configs)
