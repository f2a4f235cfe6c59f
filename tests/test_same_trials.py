"""The same config, data and seed give the same trials in the same order -- across refactors too.

``tests/data/digits_trials.json`` holds the trial sequence (flow and parameters, in order)
that the code produced before the run loop, the plan and the registries were reorganised
(commit ae5e96e). The config fixes its search values instead of ``search: true``, so new
default search values of a pass do not move it; a change to the order in which the loop asks,
the plan builds its space, or a sampler draws does, and fails this test.
Regenerate only for an intended change: ``QUANTUNE_WRITE_GOLDEN=1 pytest tests/test_same_trials.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import quantune

DIGITS = Path(__file__).parents[1] / "examples" / "digits"
GOLDEN = Path(__file__).parent / "data" / "digits_trials.json"


def _config(tmp_path: Path) -> dict:
    return {
        "model": str(DIGITS / "model.onnx"),
        "data": {"calibration": str(DIGITS / "calib.npz"), "evaluation": str(DIGITS / "eval.npz"), "batch_size": 64},
        "evaluation": {"metric": "top1", "latency": {"warmup": 1, "repeats": 3, "threads": 1}},
        "criterion": {"type": "relative", "tolerable_loss": 0.01},
        "objective": "latency",
        "passes": [
            {
                "name": "static_quant",
                "params": {
                    "quant_format": {"search": ["QDQ", "QOperator"]},
                    "activation_type": {"search": ["uint8", "int8"]},
                    "per_channel": {"search": [True, False]},
                    "calibrate_method": {"search": ["MinMax", "Entropy"]},
                },
            },
            {"name": "dynamic_quant", "params": {"weight_type": {"search": ["int8", "uint8"]}}},
        ],
        "flows": [["static_quant"], ["dynamic_quant"]],
        "search": {"sampler": "random", "seed": 7},
        "stop": {"max_trials": 6},
        "cache_dir": str(tmp_path / "cache"),
        "executor": {"kind": "inline"},
    }


def test_the_digits_trials_are_the_ones_recorded_before_the_refactor(tmp_path):
    result = quantune.tune(_config(tmp_path), output=tmp_path / "out")
    trials = [{"flow": list(t.flow), "params": t.params} for t in sorted(result.trials, key=lambda t: t.number)]
    if os.environ.get("QUANTUNE_WRITE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(trials, indent=1, sort_keys=True) + "\n")
    assert trials == json.loads(GOLDEN.read_text())
