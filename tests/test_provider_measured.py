"""Accuracy measured on the provider it is reported for (issue 24's "0 candidates whose accuracy
was measured on a provider other than the one it is reported for"), measured, not asserted.

The evaluation runner (``evaluation.runner``) receives the very session the accuracy evaluation
opened, so the runner here reports that session's provider as an output, and the metric is the
share of evaluation feeds that ran on OpenVINO's EP: each trial's recorded score says where its
accuracy was computed, as onnxruntime itself reports it. The bench's count
(``bench/providers_axis.measured_elsewhere``, read from results.json) must agree: 0.

Real parts only: OpenVINO's provider comes from the real target environment (``target_env.py``),
skipped with its reason where it cannot be made.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

import quantune
from target_env import openvino_python

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
axis = pytest.importorskip("providers_axis")

CPU, OV = "CPUExecutionProvider", "OpenVINOExecutionProvider"

RUNNER = '''
import numpy as np


def run(session, feeds):
    """The model's outputs, and which provider this session runs on (1.0: OpenVINO's EP)."""
    on = float(session.get_providers()[0] == "OpenVINOExecutionProvider")
    names = [o.name for o in session.get_outputs()]
    wanted = [i.name for i in session.get_inputs()]
    out = []
    for feed in feeds:
        values = session.run(names, {name: feed[name] for name in wanted})
        row = dict(zip(names, values))
        row["on_openvino"] = np.full((values[0].shape[0],), on, np.float32)
        out.append(row)
    return out
'''

METRIC = """
import numpy as np


def on_openvino(outputs, data):
    return float(np.mean(outputs["on_openvino"]))
"""


@pytest.fixture(scope="module")
def ov_python() -> Path:
    python, why = openvino_python()
    if python is None:
        pytest.skip(why)
    return python


def test_every_trials_accuracy_is_measured_on_its_reported_provider(
    make_config, tmp_path: Path, ov_python: Path
) -> None:
    (tmp_path / "drive.py").write_text(RUNNER)
    (tmp_path / "where.py").write_text(METRIC)
    passes = [{"name": "static_quant", "params": {"quant_format": "QDQ", "per_channel": False}}]
    config: dict[str, Any] = make_config(passes)
    config["evaluation"] = {
        "metric": f"{tmp_path / 'where.py'}:on_openvino",
        "runner": f"{tmp_path / 'drive.py'}:run",
        "latency": {"warmup": 1, "repeats": 3, "threads": 1, "confirm_top": 0},
    }
    # the original on the CPU provider scores 0, anything on OpenVINO 1: every trial meets it
    config["criterion"] = {"type": "absolute", "tolerable_loss": 0.5}
    config["objective"] = "size"
    config["target"] = {"python": str(ov_python), "providers": "auto"}
    config["stop"] = {"max_trials": 4}
    quantune.tune(config, tmp_path / "run")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    metric = results["metric"]  # the metric's key: its spec
    assert results["baseline"][metric] == 0.0  # the original, on the reference (CPU) provider

    evaluated = [t for t in results["trials"] if t["status"] == "ok"]
    reported = [t["params"].get("provider.provider", CPU) for t in evaluated]
    assert {CPU, OV} <= set(reported), reported  # both providers evaluated, so the check can fail
    for trial, provider in zip(evaluated, reported, strict=True):
        # where onnxruntime ran the trial's accuracy evaluation, as that session reported it
        assert trial["metrics"][metric] == (1.0 if provider == OV else 0.0), trial["number"]

    count = axis.measured_elsewhere(results)  # the bench table's count, from results.json alone
    assert count["elsewhere"] == 0 and count["checked"] == len(evaluated) + (results["best"] is not None)
    moved = json.loads(json.dumps(results))  # a trial reported on OpenVINO but evaluated on the CPU
    moved["trials"][0]["session_settings"] = None
    moved["trials"][0]["params"]["provider.provider"] = OV
    moved["trials"][0]["status"] = "ok"
    assert axis.measured_elsewhere(moved)["elsewhere"] == 1
