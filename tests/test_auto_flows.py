"""``flows: auto``: which flows a zero-knowledge config gets, per model, and a run through them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import quantune
from bert_model import bert_inputs, build_bert_layer
from quantune.config import load_config
from quantune.engine.plan.plan import build_plan
from quantune.errors import ConfigError
from quantune.prepare import model_facts

ALL = [
    {"name": "transformer_opt", "search": True},
    {"name": "static_quant", "search": True},
    {"name": "dynamic_quant", "search": True},
    {"name": "weight_only", "search": True},
    {"name": "fp16", "search": True},
]


def flows(make_config, model: Path, **extra) -> list[str]:
    config = load_config(make_config(ALL, model=str(model), flows="auto", **extra)).config
    return list(build_plan(config, facts=model_facts(onnx.load(str(model)))).flows)


def test_a_cnn_gets_the_quantizers_only(make_config, cnn_model):
    assert flows(make_config, cnn_model) == ["static_quant", "dynamic_quant"]
    assert flows(make_config, cnn_model, objective="size") == ["static_quant", "dynamic_quant", "fp16"]


def test_a_transformer_gets_fusion_before_quantization_and_weight_only(make_config, tmp_path):
    bert = build_bert_layer(tmp_path / "bert.onnx")
    assert flows(make_config, bert) == [
        "static_quant",
        "dynamic_quant",
        "transformer_opt",
        "transformer_opt>static_quant",
        "transformer_opt>dynamic_quant",
        "transformer_opt>weight_only",
        "weight_only",
        "weight_only>dynamic_quant",
    ]
    sized = flows(make_config, bert, objectives=["size", "accuracy"])
    assert sized[-2:] == ["fp16", "transformer_opt>fp16"]


def test_auto_refuses_passes_it_does_not_place(make_config, cnn_model):
    config = load_config(make_config([{"name": "graph_opt"}, {"name": "static_quant"}], flows="auto")).config
    with pytest.raises(ConfigError, match=r"flows: auto places .* by hand for \['graph_opt'\]"):
        build_plan(config, facts=model_facts(onnx.load(str(cnn_model))))


def test_a_zero_knowledge_run_on_a_transformer_runs_the_new_passes(make_config, tmp_path):
    bert = build_bert_layer(tmp_path / "bert.onnx")
    np.savez(tmp_path / "calib.npz", **bert_inputs(16, seed=1))
    np.savez(tmp_path / "eval.npz", **bert_inputs(16, seed=2))
    config = make_config(
        ALL,
        model=str(bert),
        flows="auto",
        data={"calibration": str(tmp_path / "calib.npz"), "evaluation": str(tmp_path / "eval.npz"), "batch_size": 8},
        evaluation={"metric": "cosine", "latency": {"warmup": 1, "repeats": 3, "threads": 1}},
        criterion={"type": "relative", "tolerable_loss": 0.05},
        objective="size",
        search={"sampler": "random", "seed": 0},
        stop={"max_trials": 10},
    )
    result = quantune.tune(config, tmp_path / "run")
    ran = {">".join(trial.flow) for trial in result.trials}
    assert len(ran) >= 4, ran
    failed = [(trial.flow, trial.error) for trial in result.trials if trial.status != "ok"]
    assert not failed
    assert result.best is not None and result.best.metrics["size_bytes"] < result.baseline["size_bytes"]
