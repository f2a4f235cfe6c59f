"""A run's identity covers what changes a score: the data's content and every script the config names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

import quantune
from conftest import cnn_inputs, run_model
from quantune.cli import main
from quantune.config import load_config
from quantune.engine.executors.worker import WorkerSpec, runner_for
from quantune.engine.trials.setup import build_run

METRIC = """
import numpy as np

def score(outputs, data):
    logits = next(iter(outputs.values()))
    return float(np.mean(np.argmax(logits, axis=1) == data["label"])) * {scale}
"""
LOADER = """
import numpy as np

def load():
    data = np.load({path!r})
    return {{"input": data["input"][:{rows}], "label": data["label"][:{rows}]}}
"""


def write_config(folder: Path, make_config, **overrides) -> Path:
    config = make_config(
        [{"name": "dynamic_quant", "params": {"weight_type": {"search": ["int8", "uint8"]}}}], **overrides
    )
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run(config: Path, out: Path, *extra: str) -> int:
    return main(["run", str(config), "--output", str(out), "--quiet", *extra])


def relabel(eval_npz: Path, model: Path, *, shift: int) -> None:
    """Rewrites the evaluation data with other rows, labelled by the model (the first half's
    labels shifted by ``shift``, so the original's top1 becomes 0.5 unless ``shift`` is 0)."""
    inputs = cnn_inputs(48, seed=7)
    labels = np.argmax(run_model(model, {"input": inputs})[0], axis=1)
    labels[:24] += shift
    np.savez(eval_npz, input=inputs, label=(labels % 4).astype(np.int64))


def test_edited_evaluation_data_is_refused_on_resume_and_restart_rescores(make_config, tmp_path, cnn_model, capsys):
    config = write_config(tmp_path, make_config)
    out = tmp_path / "out"
    assert run(config, out) == 0
    eval_npz = tmp_path / "eval.npz"
    with np.load(eval_npz) as archive:  # the same arrays written again: another file, the same content
        np.savez(eval_npz, **{key: archive[key] for key in archive.files})
    assert run(config, out) == 0, "rewriting the same content is no change"
    capsys.readouterr()

    relabel(eval_npz, cnn_model, shift=1)
    assert run(config, out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "data.evaluation" in err and "eval.npz" in err and "changed since this run started" in err
    assert "--restart" in err and "data.calibration" not in err and "Traceback" not in err

    result = quantune.tune(str(config), output=out, restart=True)
    assert result.replayed == 0
    assert result.baseline["top1"] == pytest.approx(0.5), "the relabelled data scores the original anew"


def test_an_edited_metric_script_is_refused_and_never_reuses_old_figures(make_config, tmp_path, capsys):
    metric = tmp_path / "metric.py"
    metric.write_text(METRIC.format(scale=1.0))
    config = write_config(tmp_path, make_config, evaluation={"metric": "metric.py:score", "latency": {"repeats": 3}})
    out = tmp_path / "out"
    first = quantune.tune(str(config), output=out)
    assert first.baseline["metric.py:score"] == pytest.approx(1.0)

    metric.write_text(METRIC.format(scale=0.5))
    assert run(config, out) == 2
    err = capsys.readouterr().err
    assert "evaluation.metric (metric.py) changed since this run started" in err

    second = quantune.tune(str(config), output=out, restart=True)  # the same cache folder
    assert second.baseline["metric.py:score"] == pytest.approx(0.5), "the edited script is the one that runs"
    assert all(t.cache["evaluation"] == "miss" for t in second.trials), "no figure of the old metric is reused"
    assert [t.metrics["metric.py:score"] for t in second.trials] == pytest.approx(
        [0.5 * t.metrics["metric.py:score"] for t in first.trials]
    )


def test_a_loader_script_is_part_of_the_identity(make_config, tmp_path, cnn_data, capsys):
    loader = tmp_path / "loader.py"
    loader.write_text(LOADER.format(path=str(cnn_data["evaluation"]), rows=48))
    data = {"calibration": str(cnn_data["calibration"]), "evaluation": "loader.py:load", "batch_size": 16}
    config = write_config(tmp_path, make_config, data=data)
    out = tmp_path / "out"
    assert run(config, out) == 0
    assert run(config, out) == 0, "the same loader and data resume"

    loader.write_text(LOADER.format(path=str(cnn_data["evaluation"]), rows=32))
    assert run(config, out) == 2
    err = capsys.readouterr().err
    assert "data.evaluation (loader.py:load) changed since this run started" in err
    assert run(config, out, "--restart") == 0


def test_changed_calibration_data_and_plugins_are_named(make_config, tmp_path, cnn_data, capsys):
    plugin = tmp_path / "my_plugin.py"
    plugin.write_text("# no passes yet\n")
    config = write_config(tmp_path, make_config, plugins=["my_plugin.py"])
    out = tmp_path / "out"
    assert run(config, out) == 0
    np.savez(cnn_data["calibration"], input=cnn_inputs(64, seed=9))
    plugin.write_text("# still no passes\n")
    assert run(config, out) == 2
    err = capsys.readouterr().err
    assert "data.calibration (" in err and "calib.npz" in err and "plugins[0] (my_plugin.py)" in err
    assert "data.evaluation" not in err and "evaluation.metric" not in err


def test_the_evaluation_cache_never_reuses_figures_across_changed_data(make_config, tmp_path, cnn_model):
    config = write_config(tmp_path, make_config)
    first = quantune.tune(str(config), output=tmp_path / "a")
    relabel(tmp_path / "eval.npz", cnn_model, shift=0)  # other rows, labelled by the model: top1 stays 1.0
    second = quantune.tune(str(config), output=tmp_path / "b")  # another folder, the same cache
    assert second.cache_stats["baseline"] == {"hits": 0, "misses": 1}
    assert all(t.cache["evaluation"] == "miss" for t in second.trials)
    assert all(t.cache["dynamic_quant"] == "hit" for t in second.trials), "the passes' outputs did not change"
    third = quantune.tune(str(config), output=tmp_path / "c")
    assert third.cache_stats["baseline"] == {"hits": 1, "misses": 0}, "unchanged data reuses its figures"
    assert [t.metrics["top1"] for t in third.trials] == [t.metrics["top1"] for t in second.trials]
    assert len(first.trials) == len(second.trials)


def test_a_worker_refuses_data_changed_while_the_run_goes_on(make_config, tmp_path, cnn_model):
    loaded = load_config(make_config())
    sources = build_run(loaded).context.sources
    assert runner_for(WorkerSpec(loaded, "identity-same", 0, sources)) is not None
    edited = {**sources, "data.evaluation": {**sources["data.evaluation"], "fingerprint": "before the edit"}}
    with pytest.raises(quantune.QuantuneError) as error:
        runner_for(WorkerSpec(loaded, "identity-edited", 0, edited))
    assert str(error.value).startswith(f"data.evaluation ({sources['data.evaluation']['label']}) changed while")


PLUGIN_PASS = """
import onnx
import quantune


class Config(quantune.PassConfig):
    pass


@quantune.register_pass
class IdentityCopy(quantune.Pass):
    name = "identity_test_copy"
    Config = Config

    def run(self, config, model_in, model_out, context):
        onnx.save(onnx.load(str(model_in)), str(model_out))  # {note}
"""


def test_an_edited_plugin_pass_never_reuses_its_old_outputs(make_config, tmp_path, capsys):
    plugin = tmp_path / "copy_plugin.py"
    plugin.write_text(PLUGIN_PASS.format(note="first"))
    config = make_config([{"name": "identity_test_copy"}], plugins=[str(plugin)])
    out = tmp_path / "out"
    first = quantune.tune(config, output=out)
    assert [t.cache["identity_test_copy"] for t in first.trials] == ["miss"]
    assert quantune.tune(config, output=tmp_path / "again").trials[0].cache["identity_test_copy"] == "hit"

    plugin.write_text(PLUGIN_PASS.format(note="second"))
    with pytest.raises(quantune.QuantuneError, match=r"plugins\[0\] \(.*copy_plugin.py\) changed since this run"):
        quantune.tune(config, output=out)
    second = quantune.tune(config, output=out, restart=True)
    assert [t.cache["identity_test_copy"] for t in second.trials] == ["miss"], "the new code runs"
