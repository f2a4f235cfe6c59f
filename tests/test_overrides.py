"""``--set KEY=VALUE`` and ``tune(config, overrides=...)``: fields set before validation, checked
like the file, relative paths still relative to the config file; a mistake is one line naming
the override."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

import quantune
from quantune.cli import main
from quantune.config.overrides import parse_set
from quantune.errors import ConfigError


@pytest.fixture
def config_file(tmp_path: Path, make_config) -> Path:
    """A config in its own folder whose model and data paths are relative to it."""
    folder = tmp_path / "project"
    folder.mkdir()
    config = make_config()
    for key in ("calibration", "evaluation"):
        source = Path(config["data"][key])
        shutil.copy(source, folder / source.name)
        config["data"][key] = source.name
    shutil.copy(config["model"], folder / "model.onnx")
    config["model"] = "model.onnx"
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_parse_set_reads_yaml_values():
    assert parse_set(["stop.max_trials=5", "search.sampler=random", "stop.timeout_s=null"]) == {
        "stop.max_trials": 5,
        "search.sampler": "random",
        "stop.timeout_s": None,
    }
    assert parse_set(["passes.0.params.per_channel={search: [false, true]}"]) == {
        "passes.0.params.per_channel": {"search": [False, True]}
    }
    assert parse_set(["search.sampler='5'"]) == {"search.sampler": "5"}


def test_overrides_keep_paths_relative_to_the_file(config_file, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # not the config's folder
    loaded = quantune.load_config(
        config_file, {"stop.max_trials": 1, "search.sampler": "random", "passes.0.params.per_channel": True}
    )
    assert loaded.base_dir == config_file.parent.resolve()
    assert loaded.config.stop.max_trials == 1 and loaded.config.search.sampler == "random"
    assert loaded.config.passes[0].params["per_channel"] is True
    assert loaded.resolve(loaded.config.model) == (config_file.parent / "model.onnx").resolve()
    # the file itself is unchanged, and without overrides it loads as before
    assert quantune.load_config(config_file).config.stop.max_trials == 8


def test_tune_with_overrides_runs_the_overridden_config(config_file, tmp_path):
    result = quantune.tune(config_file, tmp_path / "out", overrides={"stop.max_trials": 1})
    assert len(result.trials) == 1
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["stop"]["max_trials"] == 1


@pytest.mark.parametrize(
    ("setting", "needles"),
    [
        ("stop.max_trials=0", ["--set stop.max_trials:", "greater than 0"]),
        ("stop.max_trial=5", ["--set stop.max_trial:", "unknown field", "max_trials"]),
        ("search.sampler=[a", ["--set search.sampler:", "not valid YAML"]),
        ("model.path=x", ["--set model.path:", "not a section"]),
        ("passes.4.name=x", ["--set passes.4.name:", "index 0..0"]),
        ("stop", ["--set stop:", "KEY=VALUE"]),
        ("criterion.type=both", ["--set criterion.type:", "relative", "absolute"]),
    ],
)
def test_bad_set_is_one_line_naming_it(config_file, capsys, setting, needles, tmp_path):
    assert main(["check", str(config_file), "--set", setting]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    for needle in needles:
        assert needle in err
    assert main(["run", str(config_file), "--set", setting, "--output", str(tmp_path / "never")]) == 2
    assert not (tmp_path / "never").exists()


def test_python_overrides_are_named_as_given(config_file):
    with pytest.raises(ConfigError, match=r"overrides\['stop.max_trials'\]: .*greater than 0"):
        quantune.check(config_file, overrides={"stop.max_trials": 0})


def test_set_on_space_and_check(config_file, capsys):
    assert main(["check", str(config_file), "--set", "evaluation.metric=cosine"]) == 0
    out = capsys.readouterr().out
    assert "cosine = 1" in out
    # what check found: the data as read, and the size of the search
    assert "evaluation: a table of 48 rows (3 batch(es) of up to 16); arrays input, label; labels in 'label'" in out
    assert "search space: flow dynamic_quant: 2 point(s)" in out
    assert main(["space", str(config_file), "--samples", "1"]) == 0
    assert "raw size: 2" in capsys.readouterr().out  # weight_type: int8, uint8
    weights = "passes.0.params.weight_type={search: [int8]}"
    assert main(["space", str(config_file), "--set", weights, "--samples", "1"]) == 0
    assert "raw size: 1" in capsys.readouterr().out
