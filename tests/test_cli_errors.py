"""User mistakes through the CLI: exit code 2 and one line on stderr naming the field, never a
traceback, and never a change to the input model."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import quantune
from conftest import INLINE_EXECUTOR
from quantune.cli import main


@pytest.fixture
def base_config(cnn_model: Path, cnn_data: dict[str, Path]) -> dict[str, Any]:
    """A valid config whose paths are relative to the config file (all files share tmp_path)."""
    return {
        "model": cnn_model.name,
        "data": {"calibration": "calib.npz", "evaluation": "eval.npz", "batch_size": 16},
        "evaluation": {"metric": "top1", "latency": {"warmup": 1, "repeats": 3}},
        "criterion": {"type": "relative", "tolerable_loss": 0.5},
        "passes": [{"name": "static_quant", "params": {"quant_format": {"search": ["QDQ", "QOperator"]}}}],
        "search": {"sampler": "exhaustive", "seed": 0},
        "stop": {"max_trials": 2},
        "cache_dir": "cache",
        **INLINE_EXECUTOR,
    }


def write_yaml(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def set_path(config: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2, f"exit code {code}; stderr: {err!r}"
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {lines!r}"
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


def _garbage_model(tmp_path: Path, config: dict[str, Any]) -> None:
    (tmp_path / "broken.onnx").write_bytes(b"\x08\xff\xff garbage, not a protobuf \x00\x13\x37" * 8)
    config["model"] = "broken.onnx"


def _eval_without_input(tmp_path: Path, config: dict[str, Any]) -> None:
    np.savez(tmp_path / "wrong.npz", pixels=np.zeros((4, 1, 8, 8), np.float32), label=np.zeros(4, np.int64))
    config["data"]["evaluation"] = "wrong.npz"


def _eval_without_labels(tmp_path: Path, config: dict[str, Any]) -> None:
    np.savez(tmp_path / "nolabel.npz", input=np.zeros((4, 1, 8, 8), np.float32))
    config["data"]["evaluation"] = "nolabel.npz"


def _calib_without_input(tmp_path: Path, config: dict[str, Any]) -> None:
    np.savez(tmp_path / "wrongcalib.npz", image=np.zeros((4, 1, 8, 8), np.float32))
    config["data"]["calibration"] = "wrongcalib.npz"


def _edit(dotted: str, value: Any) -> Callable[[Path, dict[str, Any]], None]:
    def apply(tmp_path: Path, config: dict[str, Any]) -> None:
        set_path(config, dotted, value)

    return apply


def _add(key: str, value: Any) -> Callable[[Path, dict[str, Any]], None]:
    def apply(tmp_path: Path, config: dict[str, Any]) -> None:
        config[key] = value

    return apply


def _drop(key: str) -> Callable[[Path, dict[str, Any]], None]:
    def apply(tmp_path: Path, config: dict[str, Any]) -> None:
        del config[key]

    return apply


def _pass_params(params: dict[str, Any], name: str = "static_quant") -> Callable[[Path, dict[str, Any]], None]:
    def apply(tmp_path: Path, config: dict[str, Any]) -> None:
        config["passes"] = [{"name": name, "params": params}]

    return apply


CASES = {
    "unknown pass": (_edit("passes.0.name", "no_such_pass"), ["passes[0].name", "no_such_pass"]),
    "unknown pass parameter": (_pass_params({"bogus_param": 1}), ["passes[0].params.bogus_param"]),
    "bad fixed pass value": (_pass_params({"calibrate_method": "Bogus"}), ["calibrate_method"]),
    "wrong type": (_edit("stop.max_trials", "many"), ["stop.max_trials"]),
    "negative trials": (_edit("stop.max_trials", -1), ["stop.max_trials"]),
    "unknown top-level field": (_add("bogus_field", 1), ["bogus_field"]),
    "unknown nested field": (_edit("data.bogus_data", 1), ["data.bogus_data"]),
    "missing required field": (_drop("model"), ["model"]),
    "bad criterion type": (_edit("criterion.type", "percent"), ["criterion.type"]),
    "missing model file": (_edit("model", "missing.onnx"), ["model", "missing.onnx"]),
    "model does not load": (_garbage_model, ["model", "broken.onnx"]),
    "missing evaluation data": (_edit("data.evaluation", "missing.npz"), ["data.evaluation", "missing.npz"]),
    "missing calibration data": (_edit("data.calibration", "missing.npz"), ["data.calibration", "missing.npz"]),
    "evaluation data lacks an input": (_eval_without_input, ["data.evaluation", "input"]),
    "calibration data lacks an input": (_calib_without_input, ["data.calibration", "input"]),
    "evaluation data lacks labels": (_eval_without_labels, ["label"]),
    "unknown metric": (_edit("evaluation.metric", "top5"), ["evaluation.metric", "top5"]),
    "unknown sampler": (_edit("search.sampler", "bogus_sampler"), ["search.sampler", "bogus_sampler"]),
    "searched value not allowed": (
        _pass_params({"calibrate_method": {"search": ["MinMax", "Bogus"]}}),
        ["calibrate_method", "Bogus"],
    ),
    "empty search list": (_pass_params({"per_channel": {"search": []}}), ["per_channel"]),
    "conditional on an unknown value": (
        _pass_params(
            {
                "calibrate_method": {"search": ["MinMax", "Percentile"]},
                "percentile": {"search": {"when": "calibrate_method", "cases": {"Bogus": [99.9]}}},
            }
        ),
        ["Bogus"],
    ),
    "conditional cycle": (
        _pass_params(
            {
                "percentile": {"search": {"when": "calibrate_method", "cases": {"Percentile": [99.9]}}},
                "calibrate_method": {"search": {"when": "percentile", "cases": {"99.9": ["Percentile"]}}},
            }
        ),
        ["cycle"],
    ),
    "static quant without calibration": (_edit("data.calibration", None), ["data.calibration"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_config_error_is_one_line_exit_2(case, base_config, tmp_path, cnn_model, capsys):
    mutate, needles = CASES[case]
    mutate(tmp_path, base_config)
    config_path = write_yaml(tmp_path / "config.yaml", base_config)
    model_bytes = cnn_model.read_bytes()
    code, out, err = run_cli(["run", str(config_path), "--output", str(tmp_path / "out"), "--quiet"], capsys)
    assert_one_line_error(code, out, err, *needles)
    assert cnn_model.read_bytes() == model_bytes


def test_yaml_syntax_error_exits_2_without_traceback(base_config, tmp_path, cnn_model, capsys):
    config_path = tmp_path / "config.yaml"
    config_path.write_text("model: cnn.onnx\ndata: [unclosed\n  evaluation: eval.npz\n")
    code, out, err = run_cli(["run", str(config_path), "--output", str(tmp_path / "out"), "--quiet"], capsys)
    assert code == 2
    assert "Traceback" not in out + err
    assert "config.yaml" in err and "YAML" in err
    assert not (tmp_path / "out").exists()


def test_yaml_syntax_error_is_one_line(tmp_path, capsys):
    config_path = tmp_path / "config.yaml"
    config_path.write_text("model: cnn.onnx\ndata: [unclosed\n  evaluation: eval.npz\n")
    code, out, err = run_cli(["run", str(config_path), "--quiet"], capsys)
    assert_one_line_error(code, out, err, "config.yaml")


def test_json_syntax_error_is_one_line(tmp_path, capsys):
    config_path = tmp_path / "config.json"
    config_path.write_text('{"model": "cnn.onnx", ')
    code, out, err = run_cli(["run", str(config_path), "--quiet"], capsys)
    assert_one_line_error(code, out, err, "config.json", "JSON")


def test_top_level_must_be_a_mapping(tmp_path, capsys):
    config_path = tmp_path / "config.yaml"
    config_path.write_text("- just\n- a list\n")
    code, out, err = run_cli(["run", str(config_path), "--quiet"], capsys)
    assert_one_line_error(code, out, err, "config.yaml")


def test_missing_config_file(tmp_path, capsys):
    code, out, err = run_cli(["run", str(tmp_path / "nope.yaml"), "--quiet"], capsys)
    assert_one_line_error(code, out, err, "nope.yaml")


def test_space_command_reports_config_errors_too(base_config, tmp_path, capsys):
    base_config["passes"][0]["params"] = {"bogus_param": 1}
    config_path = write_yaml(tmp_path / "config.yaml", base_config)
    code, out, err = run_cli(["space", str(config_path)], capsys)
    assert_one_line_error(code, out, err, "bogus_param")


def test_empty_model_file_is_a_one_line_error(base_config, tmp_path, capsys):
    (tmp_path / "empty.onnx").write_bytes(b"")
    base_config["model"] = "empty.onnx"
    config_path = write_yaml(tmp_path / "config.yaml", base_config)
    code, out, err = run_cli(["run", str(config_path), "--output", str(tmp_path / "out"), "--quiet"], capsys)
    assert_one_line_error(code, out, err, "model", "empty.onnx")


def test_a_config_error_does_not_claim_the_output_folder(base_config, tmp_path, capsys):
    out = tmp_path / "out"
    base_config["search"]["sampler"] = "bogus_sampler"
    config_path = write_yaml(tmp_path / "config.yaml", base_config)
    code, _, _ = run_cli(["run", str(config_path), "--output", str(out), "--quiet"], capsys)
    assert code == 2
    base_config["search"]["sampler"] = "exhaustive"
    write_yaml(config_path, base_config)
    code, _, err = run_cli(["run", str(config_path), "--output", str(out), "--quiet"], capsys)
    assert code == 0, err


def test_a_valid_run_exits_0_and_leaves_the_model_alone(base_config, tmp_path, cnn_model, capsys):
    base_config.pop("executor", None)  # the default executor, as a user would run it
    model_bytes = cnn_model.read_bytes()
    config_path = write_yaml(tmp_path / "config.yaml", base_config)
    code, out, err = run_cli(["run", str(config_path), "--output", str(tmp_path / "out"), "--quiet"], capsys)
    assert code == 0, err
    assert "Traceback" not in out + err
    assert (tmp_path / "out" / "results.json").is_file()
    assert cnn_model.read_bytes() == model_bytes
    # Relative paths were resolved against the config file's folder, including the cache.
    assert (tmp_path / "cache" / "models").is_dir()


@pytest.mark.parametrize("kind", ["inline", "process"])
def test_a_metric_that_fails_on_the_original_model_is_one_line(tmp_path, make_config, capsys, kind):
    script = tmp_path / "metric.py"
    script.write_text("def broken(outputs, data):\n    return outputs[0]\n")  # outputs is a dict by name
    config = make_config(
        evaluation={"metric": f"{script}:broken", "latency": {"warmup": 0, "repeats": 2}},
        executor={"kind": kind, "workers": 2},
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    code = main(["run", str(path), "--output", str(tmp_path / "out")])
    _, err = capsys.readouterr()
    assert_one_line_error(code, "", err, "evaluating the original model failed", "broken", "KeyError")
    assert multiprocessing.active_children() == [], "workers started for the run must be stopped"


def test_a_space_with_nothing_runnable_is_a_config_error(tmp_path, make_config, capsys):
    config = make_config(passes=[{"name": "graph_opt", "params": {"level": "all"}}, {"name": "static_quant"}])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    code = main(["run", str(path), "--output", str(tmp_path / "out")])
    _, err = capsys.readouterr()
    assert_one_line_error(code, "", err, "every point of the search space is pruned", "graph_opt")
    assert not (tmp_path / "out").exists(), "a config mistake must not claim the output folder"


@pytest.mark.parametrize(
    ("override", "needle"), [({"workers": 0}, "executor.workers"), ({"executor": "foo"}, "executor.kind")]
)
def test_tune_overrides_are_validated_like_the_config(make_config, tmp_path, override, needle):
    with pytest.raises(quantune.QuantuneError, match=needle):
        quantune.tune(make_config(), output=tmp_path / "out", **override)
