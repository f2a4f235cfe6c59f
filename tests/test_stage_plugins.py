"""A user's plugin pass (a class from a file named by its path) before the quantization step: the
stages that run in spawned workers (the sensitivity analysis, the speed ceilings, the builds ahead
of them) import it as trial workers do, instead of failing and leaving groups in graph order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import quantune
from quantune.engine.executors.stage import Isolation, run_stage
from quantune.passes.registry import find_pass
from quantune.userimport import load_plugins

# a pass that checks its model (onnx's checker) and copies it, placed before the quantization
PLUGIN = """
import shutil
import onnx
from quantune import Pass, PassConfig, register_pass

class CheckedCopyConfig(PassConfig):
    full_check: bool = False

@register_pass
class CheckedCopy(Pass):
    name = "checked_copy"
    Config = CheckedCopyConfig
    role = "prepare"
    def run(self, config, model_in, model_out, context):
        onnx.checker.check_model(str(model_in), full_check=config.full_check)
        shutil.copyfile(model_in, model_out)
"""


def _describe(pass_cls: type, config: Any) -> str:
    return f"{pass_cls.name} full_check={config.full_check}"


@pytest.mark.parametrize("fork_server", ["1", "0"], ids=["fork-server", "spawn"])
def test_a_stage_job_holding_a_plugins_classes_runs_in_its_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fork_server: str
) -> None:
    monkeypatch.setenv("QUANTUNE_FORKSERVER", fork_server)
    (tmp_path / "checked_copy.py").write_text(PLUGIN)
    load_plugins(["checked_copy.py"], tmp_path)  # as the engine loads a config's plugins
    pass_cls = find_pass("checked_copy")
    assert pass_cls is not None
    job = (pass_cls, pass_cls.Config(full_check=True))
    isolation = Isolation(log_dir=tmp_path)
    outcome = run_stage("sensitivity", _describe, *job, isolation=isolation)
    assert outcome.error is None and outcome.value == "checked_copy full_check=True"
    assert not isolation.stages.errors


@pytest.mark.parametrize("prebuild", ["1", "0"], ids=["ceilings-built-ahead", "ceilings-in-their-stage"])
def test_a_plugin_pass_before_the_quantization_runs_in_every_stage_worker(
    tmp_path: Path, make_config: Any, monkeypatch: pytest.MonkeyPatch, prebuild: str
) -> None:
    monkeypatch.setenv("QUANTUNE_PREBUILD", prebuild)
    plugin = tmp_path / "checked_copy.py"
    plugin.write_text(PLUGIN)
    config = make_config(
        passes=[
            {"name": "checked_copy"},
            {"name": "static_quant", "search": True, "params": {"quant_format": "QDQ", "per_channel": False}},
        ],
        plugins=[str(plugin)],
        # less than the one row int8 loses: the search falls back, so the sensitivity stage runs
        criterion={"type": "relative", "tolerable_loss": 0.01},
        search={"sampler": "random", "seed": 0, "strategy": "quantune", "strategy_options": {"drop_slow": False}},
        stop={"max_trials": 3},
        executor={"kind": "process", "workers": 1, "trial_timeout_s": 300},
    )
    quantune.tune(config, output=tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["stage_errors"] == []
    stages = set(saved["stage_peak_rss_mb"])  # the stages that ran in workers
    assert "sensitivity" in stages and {"ceiling_build", "speed_ceiling"} & stages
    log = (tmp_path / "out" / "quantune.log").read_text()
    assert "could not start" not in log and "graph order" not in log
