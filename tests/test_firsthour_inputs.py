"""Issue 26 (items 3, 8, 9): bad input a new user gives, each refused with one line naming the
file or field and what would be right -- exit 2, no traceback, no wrong result."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from conftest import INLINE_EXECUTOR, cnn_inputs
from quantune.cli import main

SRC = Path(__file__).resolve().parent.parent / "src"


@pytest.fixture
def config(tmp_path: Path, cnn_model: Path, cnn_data: dict[str, Path]) -> dict[str, Any]:
    return {
        "model": cnn_model.name,
        "data": {"calibration": "calib.npz", "evaluation": "eval.npz", "batch_size": 16},
        "evaluation": {"metric": "top1", "latency": {"warmup": 0, "repeats": 1, "confirm_top": 0}},
        "criterion": {"type": "absolute", "tolerable_loss": 1.0},
        "passes": [{"name": "static_quant"}],
        "stop": {"max_trials": 1},
        "cache_dir": "cache",
        **INLINE_EXECUTOR,
    }


def write(tmp_path: Path, config: dict[str, Any], name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def one_line(capsys, args: list[str], *needles: str, code: int = 2) -> str:
    got = main(args)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    assert got == code, captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quantune: error: "), captured.err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# -- item 3: data of another kind, NaN labels --------------------------------------------------
def test_integer_data_for_a_float_input_is_refused(tmp_path, config, capsys):
    rows = 32
    np.savez(tmp_path / "int.npz", input=(cnn_inputs(rows, 1) * 255).astype(np.int64), label=np.zeros(rows, np.int64))
    config["data"]["evaluation"] = "int.npz"
    one_line(capsys, ["check", str(write(tmp_path, config))], "int.npz", "'input'", "int64", "float32")


def test_float64_data_for_a_float_input_is_still_converted(tmp_path, config, capsys):
    rows = 32
    np.savez(tmp_path / "f64.npz", input=cnn_inputs(rows, 1).astype(np.float64), label=np.zeros(rows, np.int64))
    config["data"]["evaluation"] = "f64.npz"
    assert main(["check", str(write(tmp_path, config))]) == 0


def test_nan_labels_are_refused(tmp_path, config, capsys):
    rows = 32
    labels = np.zeros(rows, np.float64)
    labels[3] = np.nan
    np.savez(tmp_path / "nanl.npz", input=cnn_inputs(rows, 1), label=labels)
    config["data"]["evaluation"] = "nanl.npz"
    one_line(capsys, ["check", str(write(tmp_path, config))], "nanl.npz", "label", "NaN")


# -- item 8: things in the way ------------------------------------------------------------------
def test_a_cache_dir_that_is_a_file(tmp_path, config, capsys):
    (tmp_path / "afile").write_text("x")
    config["cache_dir"] = "afile"
    one_line(capsys, ["run", str(write(tmp_path, config)), "-o", str(tmp_path / "o"), "-q"], "cache_dir", "afile")


def test_a_cache_dir_that_cannot_be_made(tmp_path, config, capsys, monkeypatch):
    del config["cache_dir"]
    monkeypatch.setenv("QUANTUNE_CACHE_DIR", "/proc/nope")
    one_line(capsys, ["run", str(write(tmp_path, config)), "-o", str(tmp_path / "o"), "-q"], "/proc/nope")


@pytest.mark.parametrize("output", ["afile/out", "/proc/nope/out"])
def test_an_output_that_cannot_be_made(tmp_path, config, capsys, output):
    (tmp_path / "afile").write_text("x")
    target = output if output.startswith("/") else str(tmp_path / output)
    line = one_line(capsys, ["run", str(write(tmp_path, config)), "-o", target, "-q"], "--output")
    assert ("afile" if output.startswith("afile") else "/proc/nope") in line  # names the path in the way
    assert (tmp_path / "afile").read_text() == "x"  # the file in the way is left as it was


def test_a_binary_config(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_bytes(b"model: m.onnx\n\xf0\x28\x8c\x28\x00\x01")
    one_line(capsys, ["check", str(path)], "config.yaml", "not a text file")


def test_schema_into_a_closed_pipe_is_quiet():
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        f"'{sys.executable}' -m quantune schema | head -c 10",
        shell=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.stdout.startswith("{")
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


# -- item 9: wrong messages in the config ----------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [("stop.max_trials", True), ("data.batch_size", True), ("criterion.tolerable_loss", False), ("search.seed", True)],
)
def test_a_bool_for_a_number_field_is_refused(tmp_path, config, capsys, field, value):
    section, key = field.split(".")
    config.setdefault(section, {})[key] = value
    one_line(capsys, ["check", str(write(tmp_path, config))], field, "not a number")


def test_bool_fields_still_take_bools(tmp_path, config, capsys):
    config["criterion"]["higher_is_better"] = True
    config["stop"]["stop_when_met"] = True
    config["prepare"] = False  # YAML's `off`
    assert main(["check", str(write(tmp_path, config))]) == 0


def test_a_duplicate_yaml_key_is_refused(tmp_path, config, capsys):
    text = yaml.safe_dump(config, sort_keys=False) + "stop:\n  max_trials: 3\n"
    (tmp_path / "dup.yaml").write_text(text)
    one_line(capsys, ["check", str(tmp_path / "dup.yaml")], "dup.yaml", "'stop'", "twice", "line")


def test_a_yaml_merge_key_may_still_be_overridden(tmp_path, config, capsys):
    text = yaml.safe_dump({k: v for k, v in config.items() if k != "stop"}, sort_keys=False)
    text += "x-base: &base {max_trials: 5}\n"
    (tmp_path / "merge.yaml").write_text(text + "stop:\n  <<: *base\n  max_trials: 1\n")
    line = one_line(capsys, ["check", str(tmp_path / "merge.yaml")], "x-base")  # the anchor's holder is unknown
    assert "twice" not in line


def test_a_duplicate_json_key_is_refused(tmp_path, capsys):
    (tmp_path / "c.json").write_text('{"model": "a.onnx", "model": "b.onnx"}')
    one_line(capsys, ["check", str(tmp_path / "c.json")], "c.json", "'model'", "twice")


def test_an_infinite_budget_is_said_plainly(tmp_path, config, capsys):
    config["criterion"] = {"type": "relative", "tolerable_loss": float("inf")}
    assert main(["run", str(write(tmp_path, config)), "-o", str(tmp_path / "o"), "-q"]) == 0
    err = capsys.readouterr().err
    assert "did you mean" not in err and "not guarded" in err


def test_a_bool_mask_for_an_integer_input_is_still_converted(tmp_path, capsys):
    """True/False for an int64 mask keeps its meaning (1/0): not another kind of number."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["mask"], ["y"], to=TensorProto.FLOAT)],
        "g",
        [helper.make_tensor_value_info("mask", TensorProto.INT64, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    import onnx

    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "mask.onnx")
    np.savez(tmp_path / "mask.npz", mask=np.random.default_rng(0).random((8, 4)) > 0.5)
    config = {
        "model": "mask.onnx",
        "data": {"evaluation": "mask.npz", "calibration": "mask.npz"},
        "evaluation": {"metric": "cosine"},
        "passes": [{"name": "dynamic_quant"}],
        **INLINE_EXECUTOR,
    }
    assert main(["check", str(write(tmp_path, config))]) == 0, capsys.readouterr().err
