"""The output folder is claimed safely: another config's run, foreign files and the input model
are never overwritten."""

from __future__ import annotations

import contextlib
import json
import shutil

import pytest
import yaml

import quantune
from conftest import build_cnn
from quantune.cli import main
from quantune.model import file_sha256

# QOperator int8 makes the tiny CNN's file smaller, so on size the verdict is a sure "improved"
IMPROVING = {"passes": [{"name": "static_quant", "params": {"quant_format": "QOperator"}}], "objective": "size"}


def small_config(make_config, **overrides):
    return make_config(
        [{"name": "dynamic_quant", "params": {"weight_type": {"search": ["int8", "uint8"]}}}], **overrides
    )


def test_same_config_may_rerun_in_the_same_folder(make_config, tmp_path):
    out = tmp_path / "out"
    config = small_config(make_config)
    quantune.tune(config, output=out)
    again = quantune.tune(config, output=out)
    assert len(again.trials) == 2
    assert len(json.loads((out / "results.json").read_text())["trials"]) == 2


def test_folder_of_another_config_is_refused_unless_restart(make_config, tmp_path):
    out = tmp_path / "out"
    first = small_config(make_config)
    quantune.tune(first, output=out)
    before = (out / "results.json").read_bytes()

    other = small_config(make_config, criterion={"type": "relative", "tolerable_loss": 0.2})
    with pytest.raises(quantune.QuantuneError, match="restart"):
        quantune.tune(other, output=out)
    assert (out / "results.json").read_bytes() == before, "a refused run must not touch the old results"

    result = quantune.tune(other, output=out, restart=True)
    assert len(result.trials) == 2 and result.replayed == 0
    assert json.loads((out / "config.json").read_text())["criterion"]["tolerable_loss"] == 0.2


def test_a_run_goes_on_with_more_trials_in_the_same_folder(make_config, tmp_path):
    """Stop conditions are not part of a run's identity: raising max_trials continues the run."""
    out = tmp_path / "out"
    first = quantune.tune(small_config(make_config, stop={"max_trials": 1}), output=out)
    assert len(first.trials) == 1
    more = quantune.tune(small_config(make_config, stop={"max_trials": 2}), output=out)
    assert len(more.trials) == 2 and more.replayed == 1
    assert more.trials[0].params == first.trials[0].params


def test_cli_refuses_another_configs_folder_unless_restart(make_config, tmp_path, capsys):
    out = tmp_path / "out"
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text(yaml.safe_dump(small_config(make_config)))
    second.write_text(yaml.safe_dump(small_config(make_config, criterion={"type": "relative", "tolerable_loss": 0.2})))
    assert main(["run", str(first), "--output", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["run", str(second), "--output", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--restart" in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1
    assert main(["run", str(second), "--output", str(out), "--quiet", "--restart"]) == 0


def test_folder_with_foreign_files_is_refused(make_config, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(quantune.QuantuneError, match=r"notes\.txt"):
        quantune.tune(small_config(make_config), output=out)
    with pytest.raises(quantune.QuantuneError):
        quantune.tune(small_config(make_config), output=out, restart=True)
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_cli_refuses_folder_with_foreign_files(make_config, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "photo.jpg").write_bytes(b"\xff\xd8")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(small_config(make_config)))
    assert main(["run", str(config), "--output", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "photo.jpg" in err and "Traceback" not in err
    assert (out / "photo.jpg").read_bytes() == b"\xff\xd8"


def test_output_that_is_a_file_is_refused(make_config, tmp_path):
    target = tmp_path / "results"
    target.write_text("a file")
    with pytest.raises(quantune.QuantuneError):
        quantune.tune(small_config(make_config), output=target)
    assert target.read_text() == "a file"


def test_input_model_inside_best_is_never_overwritten(make_config, tmp_path):
    out = tmp_path / "out"
    (out / "best").mkdir(parents=True)
    model = build_cnn(out / "best" / "model.onnx", seed=5)
    sha = file_sha256(model)
    with pytest.raises(quantune.QuantuneError):
        quantune.tune(small_config(make_config, model=str(model)), output=out)
    assert file_sha256(model) == sha


def test_input_model_inside_closest_miss_is_never_deleted(make_config, tmp_path):
    out = tmp_path / "out"
    (out / "closest_miss").mkdir(parents=True)
    model = build_cnn(out / "closest_miss" / "model.onnx", seed=5)
    backup = tmp_path / "backup.onnx"
    shutil.copyfile(model, backup)
    # Refusing the folder is fine; deleting the model is not.
    with contextlib.suppress(quantune.QuantuneError):
        quantune.tune(small_config(make_config, model=str(model)), output=out)
    assert model.is_file()
    assert file_sha256(model) == file_sha256(backup)


def test_results_are_written_where_asked(make_config, tmp_path):
    out = tmp_path / "deep" / "nested" / "out"
    result = quantune.tune(make_config(**IMPROVING), output=out)
    assert result.output_dir == out.resolve()
    for name in ("results.json", "run.db", "config.json", "quantune.log"):
        assert (out / name).is_file(), name
    assert result.best_model_path == out.resolve() / "best" / "model.onnx"
    assert result.best_model_path.is_file()


def test_resume_after_the_cache_was_cleared_keeps_a_matching_best_pair(make_config, tmp_path):
    config = make_config(**IMPROVING)
    out = tmp_path / "out"
    first = quantune.tune(config, output=out)
    model_bytes = (out / "best" / "model.onnx").read_bytes()
    shutil.rmtree(tmp_path / "cache")  # the models the trials made are gone
    second = quantune.tune(config, output=out)  # resumes: the trial whose model is gone runs again
    assert len(first.trials) == 1 and second.replayed == 0
    assert json.loads((out / "results.json").read_text())["replayed_trials"] == 0
    # best/ holds the rebuilt model and the params.json that describes that same model
    assert (out / "best" / "model.onnx").read_bytes() == model_bytes
    assert json.loads((out / "best" / "params.json").read_text())["trial"] == second.best.number
