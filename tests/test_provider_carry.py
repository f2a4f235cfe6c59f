"""The model the accuracy search finds is a candidate on every provider that can run it.

Recovery runs in one variant on one provider; the model in budget it finds is then evaluated on
each other provider that loads its quantization (accuracy measured there), judged side by side
with the incumbent, and recovered again there when that provider's numbers miss the budget. A
provider whose ceiling is surely slower than the incumbent is never tried, and the stop reason
says so.

The strategy tests drive it with constructed timings and accuracies over the engine's own plan
(nothing runs on a provider), so each decision is fixed by its inputs. The run on OpenVINO uses
the real target environment (``target_env.py``), skipped with its reason where it cannot be made.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import quantune
from conftest import accuracy_problem
from quantune.report.where import target_lines
from quantune.space import Point
from quantune.strategy import WAIT, Outcome, create_strategy

CPU, OV = "CPUExecutionProvider", "OpenVINOExecutionProvider"
KEY, EXCLUDE = "provider.provider", "static_quant.nodes_to_exclude"


def _config(make_config) -> dict[str, Any]:
    """One quantization (QDQ, uint8, per-tensor) on the CPU provider and OpenVINO's."""
    passes = [
        {
            "name": "static_quant",
            "search": True,
            "params": {"quant_format": "QDQ", "activation_type": "uint8", "per_channel": False},
        },
        {"name": "execution_provider", "id": "provider", "params": {"provider": {"search": [CPU, OV]}}},
    ]
    options = {"screen_trials": 0, "latency_trials": 0, "first_guess": False}
    return make_config(passes, search={"strategy": "quantune", "strategy_options": options})


def _strategy(make_config, speed, **fields: Any) -> Any:
    """The quantune strategy over the plan, timing by ``speed(point)`` (latency over the original's)."""

    def paired(candidate: Point, cflow: Any, reference: Point, rflow: Any) -> dict[str, Any]:
        ratio = speed(candidate) / speed(reference)
        return {"faster": ratio < 0.97, "ratio_median": ratio, "ratio_ci_low": ratio, "ratio_ci_high": ratio}

    problem = dataclasses.replace(
        accuracy_problem(_config(make_config)),
        latency_ratio=lambda point, flow: speed(point),
        paired_latency=paired,
        **fields,
    )
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    strategy.observe_baseline({"latency_ms": 1.0})
    return strategy


def _speed(point: Point, full: dict[str, float], per_group: dict[str, float]) -> float:
    """A constructed latency: the original 1.0 (0.9 on OpenVINO); a quantized model its provider's
    fully quantized figure plus what each group kept in fp32 costs there."""
    provider = point.get(KEY, CPU)
    if "static_quant" not in str(point.get("flow", "")):
        return 1.0 if provider == CPU else 0.9
    return full[provider] + per_group[provider] * len(point.get(EXCLUDE, []))


def _drive(strategy: Any, judge) -> list[tuple[Point, str]]:
    seen = []
    for number in range(80):
        proposal = strategy.ask()
        if proposal is None:
            break
        assert proposal is not WAIT
        outcome = judge(proposal.point)
        strategy.tell(proposal, dataclasses.replace(outcome, number=number))
        seen.append((proposal.point, proposal.stage))
    return seen


def _judge(holds) -> Any:
    def judge(point: Point) -> Outcome:
        meets = holds(point.get(KEY, CPU), set(point.get(EXCLUDE, [])))
        return Outcome(1.0, 0.0 if meets else 0.1, meets, {"latency_ms": 1.0})

    return judge


def test_the_model_found_on_the_cpu_provider_is_faster_on_openvino_and_is_the_answer(make_config) -> None:
    """Recovered on the CPU provider (its ceiling is the fastest), the model in budget keeps conv2 in
    fp32, which costs much there and little on OpenVINO: evaluated on OpenVINO it is in budget and
    faster side by side, so the search ends there (at OpenVINO's ceiling, within the noise)."""

    def speed(point: Point) -> float:
        return _speed(point, {CPU: 0.5, OV: 0.55}, {CPU: 0.2, OV: 0.005})

    strategy = _strategy(make_config, speed)
    seen = _drive(strategy, _judge(lambda provider, fp32: "conv2" in fp32))
    carried = [(p, s) for p, s in seen if s.startswith("on OpenVINO")]
    assert carried and carried[0][0][KEY] == OV and "conv2" in carried[0][0][EXCLUDE]
    assert strategy.shared.settled is not None and strategy.shared.settled[KEY] == OV, strategy.finished_reason
    assert "conv2" in strategy.shared.settled[EXCLUDE]
    assert any(line.startswith("on OpenVINO: ") and "the search goes on from it" for line in strategy.shared.decisions)


def test_where_openvino_changes_the_numbers_its_own_culprits_are_found_there(make_config) -> None:
    """The CPU provider's model in budget (conv2 in fp32) misses on OpenVINO, where conv1 is the
    culprit: a recovery of OpenVINO's own finds it, every evaluation on OpenVINO, and it is the answer."""

    def speed(point: Point) -> float:
        return _speed(point, {CPU: 0.5, OV: 0.55}, {CPU: 0.2, OV: 0.005})

    def holds(provider: str, fp32: set[str]) -> bool:
        return "conv2" in fp32 if provider == CPU else "conv1" in fp32

    strategy = _strategy(make_config, speed)
    seen = _drive(strategy, _judge(holds))
    start = next(i for i, (_, stage) in enumerate(seen) if stage.startswith("on OpenVINO"))
    assert not holds(OV, set(seen[start][0][EXCLUDE]))  # the CPU provider's culprits miss there
    assert all(point[KEY] == OV for point, _ in seen[start:])
    assert strategy.shared.settled is not None and strategy.shared.settled[KEY] == OV
    assert "conv1" in strategy.shared.settled[EXCLUDE]


def test_openvino_own_recovery_ranks_the_culprits_as_openvino_runs_the_model(make_config) -> None:
    """Where OpenVINO misses with the CPU provider's model, its recovery asks for the ranking of
    points on OpenVINO (the engine measures those there: test_sensitivity_provider.py), never
    reuses the CPU provider's, and each of its trials' stages says whose ranking it follows."""

    def speed(point: Point) -> float:
        return _speed(point, {CPU: 0.5, OV: 0.55}, {CPU: 0.2, OV: 0.005})

    def holds(provider: str, fp32: set[str]) -> bool:
        return "conv2" in fp32 if provider == CPU else "conv1" in fp32

    asked: list[str] = []

    def sensitivity(point: Point, flow: Any) -> dict[str, float]:
        asked.append(point.get(KEY, CPU))  # a second ranking: each provider's culprit first
        return {"conv2": 1.0, "conv1": 0.1} if point.get(KEY, CPU) == CPU else {"conv1": 1.0, "conv2": 0.1}

    strategy = _strategy(make_config, speed, sensitivity=sensitivity)
    seen = _drive(strategy, _judge(holds))
    own = [(p, s) for p, s in seen if s.startswith("on OpenVINO, culprits ranked as OpenVINO runs it: ")]
    assert own and all(point[KEY] == OV for point, _ in own)
    assert OV in asked and asked.index(OV) > asked.index(CPU)  # the CPU provider's first, OpenVINO's for its own
    first_fallback = next(point for point, _ in own if point.get(EXCLUDE))
    assert "conv1" in first_fallback[EXCLUDE] and "conv2" not in first_fallback[EXCLUDE]
    assert strategy.shared.settled is not None and strategy.shared.settled[KEY] == OV


def test_a_provider_whose_ceiling_is_surely_slower_is_never_tried(make_config) -> None:
    """OpenVINO's fully quantized model is slower than the CPU provider's model in budget side by side:
    no fallback there can win, so nothing is built or evaluated there after the ceilings, and the
    stop reason says why."""

    def speed(point: Point) -> float:
        return _speed(point, {CPU: 0.5, OV: 0.9}, {CPU: 0.05, OV: 0.05})

    strategy = _strategy(make_config, speed)
    seen = _drive(strategy, _judge(lambda provider, fp32: "conv2" in fp32))
    assert not any(point[KEY] == OV for point, stage in seen if not stage.startswith("ceiling"))
    assert strategy.shared.settled is None or strategy.shared.settled[KEY] == CPU
    assert "not built on OpenVINO: its speed ceiling there is" in strategy.finished_reason


def test_on_openvino_the_model_in_budget_is_evaluated_on_the_other_provider_too(
    tmp_path: Path, ov_python: Path
) -> None:
    """A real run over both providers of the OpenVINO environment, on a model that needs a fallback
    (the LayerNorm's ``variance + eps`` Add): the model in budget the recovery finds on one provider
    is evaluated on the other -- its accuracy measured there, as onnxruntime's session there reports
    -- and results.json's front names each provider's fastest model in budget.

    Which provider's ceiling is faster, and so recovered in first, and which model is faster side by
    side, is the machine's timing; so the test asserts what holds either way (``drop_slow: false``
    and ``stop_at_ceiling: false``: no ceiling or provider is skipped for its speed, and no model at
    its ceiling ends the search before the carry, so the carry always happens)."""
    from conftest import INLINE_EXECUTOR
    from layernorm_model import build_layernorm_mlp, layernorm_data

    model = build_layernorm_mlp(tmp_path / "ln.onnx")
    data = layernorm_data(tmp_path, model)
    config: dict[str, Any] = {
        "model": str(model),
        "prepare": "off",  # the decomposed LayerNorm stays: its Add is the culprit
        "data": {"calibration": str(data["calibration"]), "evaluation": str(data["evaluation"]), "batch_size": 50},
        "evaluation": {"metric": "top1", "latency": {"warmup": 1, "repeats": 3, "threads": 1, "confirm_top": 0}},
        "criterion": {"type": "relative", "tolerable_loss": 0.03},
        "passes": [
            {"name": "static_quant", "search": True, "params": {"quant_format": "QDQ", "activation_type": "uint8"}}
        ],
        "search": {
            "sampler": "random",
            "seed": 0,
            "strategy": "quantune",
            "strategy_options": {
                "drop_slow": False,
                "stop_at_ceiling": False,
                "screen_trials": 0,
                "latency_trials": 0,
                "first_guess": False,
            },
        },
        "stop": {"max_trials": 16},
        "target": {"python": str(ov_python), "providers": [CPU, OV]},
        "cache_dir": str(tmp_path / "cache"),
        **INLINE_EXECUTOR,
    }
    result = quantune.tune(config, output=tmp_path / "run")
    carried = [t for t in result.trials if t.stage.startswith(("on OpenVINO", "on CPU"))]
    assert carried, [t.stage for t in result.trials]
    first = carried[0]
    provider = first.params.get(KEY, CPU)
    assert first.stage.startswith(f"on {provider.removesuffix('ExecutionProvider')}")
    assert (first.session_settings or {}).get("provider", CPU) == provider  # measured where it says
    assert "top1" in first.metrics
    found = [t for t in result.trials if t.number < first.number and t.meets_criterion and "static_quant" in t.flow]
    assert found and all(t.params.get(KEY, CPU) != provider for t in found)  # found on the other one
    front = json.loads((tmp_path / "run" / "results.json").read_text())["provider_front"]
    assert front == result.provider_front and set(front) == {CPU, OV}  # the original on OpenVINO is in budget
    by_number = {t.number: t for t in result.trials}
    for name, number in front.items():  # each provider's fastest trial in budget, judged there
        trial = by_number[number]
        assert trial.meets_criterion and (trial.session_settings or {}).get("provider", CPU) == name
    lines = [line for line in target_lines(result) if line.startswith("fastest in budget per")]
    assert lines and all(f"{p.removesuffix('ExecutionProvider')} trial {n} " in lines[0] for p, n in front.items())
