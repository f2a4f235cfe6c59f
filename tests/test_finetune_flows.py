"""The refining passes in flows run by the engine: after static_quant, through the cache and the
worker processes, each finds the float model its input was quantized from."""

from __future__ import annotations

from pathlib import Path

import pytest

import quantune
from quantune.strategy.accuracy.context import is_recipe


@pytest.mark.parametrize("executor", ["inline", "process"])
def test_flows_with_bias_correction_and_fast_finetune_run_in_the_engine(make_config, tmp_path: Path, executor) -> None:
    passes = [
        {"id": "quant", "name": "static_quant", "params": {"per_channel": {"search": [False, True]}}},
        {"id": "bc", "name": "bias_correction"},
        {
            "id": "ft",
            "name": "fast_finetune",
            "params": {"iterations": 20, "optim": {"search": ["adaround", "adaquant"]}},
        },
    ]
    config = make_config(
        passes,
        flows=[["quant"], ["quant", "bc"], ["quant", "ft"]],
        stop={"max_trials": 12},
        executor={"kind": executor, "workers": 1},
    )
    result = quantune.tune(config, output=tmp_path / "run")
    assert all(trial.status == "ok" for trial in result.trials), [t.error for t in result.trials]
    by_flow: dict[tuple[str, ...], set[str]] = {}
    for trial in result.trials:
        by_flow.setdefault(tuple(trial.flow), set()).add(trial.model_sha256)
    assert set(by_flow) == {("quant",), ("quant", "bc"), ("quant", "ft")}
    assert not by_flow[("quant",)] & (by_flow[("quant", "bc")] | by_flow[("quant", "ft")])  # each refined the model


def test_the_accuracy_strategies_try_the_refining_passes_as_recipes() -> None:
    assert is_recipe("bias_correction") and is_recipe("fast_finetune")  # their role trait: "recover"
