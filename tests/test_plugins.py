"""One installed package adds a pass, a sampler, a strategy and a metric through entry points.

The package is real: a module and a ``.dist-info`` folder on ``sys.path`` (what pip writes),
declaring one entry point in each group. A run then names all four in its config and uses them.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

import quantune
from quantune.errors import QuantuneError
from quantune.evaluate import metric_names
from quantune.passes import get_pass, pass_names
from quantune.search import create_sampler, sampler_names
from quantune.strategy import create_strategy, strategy_names

MODULE = "quantune_all_kinds_plugin"
PLUGIN = '''
from __future__ import annotations

import shutil

import numpy as np

from quantune import Pass, PassConfig
from quantune.search.random_sampler import RandomSampler
from quantune.strategy.joint import JointStrategy


class CopyConfig(PassConfig):
    note: str = "copy"


class CopyPass(Pass):
    """Writes the model unchanged."""

    name = "plugin_copy"
    Config = CopyConfig

    def run(self, config, model_in, model_out, context):
        shutil.copyfile(model_in, model_out)


class PluginSampler(RandomSampler):
    pass


class PluginStrategy(JointStrategy):
    pass


def mean_top(outputs, data):
    """Share of rows whose arg-max is the label, like top1."""
    first = next(iter(outputs.values()))
    return float(np.mean(np.argmax(first, axis=-1) == data["label"]))
'''
ENTRY_POINTS = f"""
[quantune.passes]
plugin_copy = {MODULE}:CopyPass

[quantune.samplers]
plugin-random = {MODULE}:PluginSampler

[quantune.strategies]
plugin-joint = {MODULE}:PluginStrategy

[quantune.metrics]
plugin-top = {MODULE}:mean_top
"""


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch):
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(textwrap.dedent(PLUGIN))
    dist = folder / f"{MODULE}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {MODULE}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    return folder


def test_every_kind_is_listed_without_loading_the_plugin(installed_plugin):
    assert "plugin_copy" in pass_names()
    assert "plugin-random" in sampler_names()
    assert "plugin-joint" in strategy_names()
    assert "plugin-top" in metric_names()
    assert MODULE not in sys.modules, "listing names must not import plugins"


def test_every_kind_loads_by_name(installed_plugin):
    assert get_pass("plugin_copy").__name__ == "CopyPass"
    assert type(create_sampler("plugin-random", seed=1)).__name__ == "PluginSampler"
    assert type(create_strategy("plugin-joint")).__name__ == "PluginStrategy"


def test_a_run_uses_a_plugin_of_every_kind(installed_plugin, make_config, tmp_path):
    config = make_config(
        passes=[
            {"name": "plugin_copy"},
            {"name": "dynamic_quant", "params": {"weight_type": {"search": ["int8", "uint8"]}}},
        ],
        evaluation={"metric": "plugin-top", "latency": {"warmup": 1, "repeats": 3, "threads": 1}},
        search={"sampler": "plugin-random", "strategy": "plugin-joint", "seed": 0},
        stop={"max_trials": 2},
    )
    result = quantune.tune(config, output=tmp_path / "out")
    assert result.baseline["plugin-top"] == pytest.approx(1.0)  # labels are the fp32 model's own predictions
    assert result.trials and all("plugin-top" in t.metrics for t in result.trials if t.status == "ok")
    assert any(t.status == "ok" for t in result.trials)


def test_a_plugin_of_the_wrong_kind_is_one_clear_error(tmp_path, monkeypatch):
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "quantune_wrong_kind.py").write_text("NOT_A_PASS = 3\n")
    dist = folder / "quantune_wrong_kind-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: quantune_wrong_kind\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[quantune.passes]\nwrong = quantune_wrong_kind:NOT_A_PASS\n")
    monkeypatch.syspath_prepend(str(folder))
    with pytest.raises(QuantuneError, match=r"passes: the entry point 'wrong' .* not a quantune Pass subclass"):
        get_pass("wrong")
