"""The commands: schema, passes, space, and the table `run` prints."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

import quantune
from quantune.cli import main


def test_schema_prints_valid_json_schema(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "properties" in schema
    for field in ("model", "data", "passes", "criterion", "search", "stop", "cache_dir"):
        assert field in schema["properties"]
    assert set(schema.get("required", [])) >= {"model", "data", "passes"}


def test_passes_lists_every_registered_pass(capsys):
    assert main(["passes"]) == 0
    out = capsys.readouterr().out
    for name in ("graph_opt", "dynamic_quant", "static_quant"):
        assert name in out
    assert "calibrate_method" in out


def test_space_on_a_small_config(tmp_path, make_config, capsys):
    config = make_config(
        [
            {
                "name": "static_quant",
                "params": {
                    "quant_format": {"search": ["QDQ", "QOperator"]},
                    "calibrate_method": {"search": ["MinMax", "Percentile"]},
                    "percentile": {"search": {"when": "calibrate_method", "cases": {"Percentile": [99.9, 99.99]}}},
                },
            }
        ]
    )
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["space", str(path)]) == 0
    out = capsys.readouterr().out
    # 2 formats x (MinMax + 2 Percentile values) = 6 points.
    sizes = [int(n) for line in out.splitlines() if "size" in line.lower() for n in re.findall(r"\b\d+\b", line)]
    assert 6 in sizes, out
    assert "static_quant.quant_format" in out


def test_cli_without_a_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2


def test_version_is_exposed():
    assert isinstance(quantune.__version__, str) and quantune.__version__


def test_run_table_fits_80_columns_with_a_user_metric(tmp_path, make_config, capsys, monkeypatch):
    script = tmp_path / "long_folder_name_for_the_metric_script" / "metric.py"
    script.parent.mkdir()
    script.write_text(
        "import numpy as np\ndef agreement(outputs, data):\n    return float(np.mean(next(iter(outputs.values())) > -100))\n"
    )
    config = make_config(
        passes=[{"name": "static_quant", "params": {"per_channel": {"search": [False, True]}}}],
        evaluation={"metric": f"{script}:agreement", "latency": {"warmup": 0, "repeats": 2, "threads": 1}},
        search={"sampler": "exhaustive", "seed": 0},
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["run", str(path), "--output", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "agreement" in out and str(script) not in out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    numbers = [row.split("│")[1].strip() for row in rows]
    assert numbers[:3] == ["orig", "0", "1"]
    assert all(row.split("│")[5].strip().endswith("*") for row in rows[:3]), "re-timed figures are marked"
    assert "timed again at the end" in out
    assert all(len(line) <= 80 for line in out.splitlines())


def test_run_starts_the_fork_server_before_validating_a_config_that_forks_workers(tmp_path: Path) -> None:
    """``quantune run`` reads ``executor.kind`` before the config is validated (0.2 s), so the fork
    server imports beside the validation -- and is not started for a run without worker processes."""
    import argparse

    from quantune.cli import _forks_workers

    def args(text: str | None, executor: str | None = None, sets: list[str] | None = None) -> argparse.Namespace:
        path = tmp_path / "quantune.yaml"
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(text)
        return argparse.Namespace(config=str(path), executor=executor, set=sets)

    assert _forks_workers(args("model: m.onnx\n"))  # the default kind: process
    assert not _forks_workers(args("model: m.onnx\nexecutor: {kind: inline}\n"))
    assert _forks_workers(args("model: m.onnx\nexecutor: {kind: inline}\n", executor="process"))
    assert not _forks_workers(args("model: m.onnx\n", sets=["executor.kind=ray"]))
    assert _forks_workers(args(None))  # unreadable: validation says what is wrong, after the hint
    assert _forks_workers(args("- a list, not a mapping\n"))


def test_the_command_ends_without_the_interpreters_teardown_yet_owes_nothing(tmp_path: Path) -> None:
    """``python -m quantune run`` ends with ``os._exit`` once its exit handlers ran (the teardown
    took 0.2-0.4 s after the verdict): the printed verdict, the log's last line, the closed run
    store and the exit code are all there, as with a normal exit."""
    import os
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    for name in ("model.onnx", "calib.npz", "eval.npz"):
        shutil.copy(root / "examples" / "digits" / name, tmp_path / name)
    config = yaml.safe_load((root / "examples" / "digits" / "config.yaml").read_text())
    config["evaluation"]["latency"] = {"warmup": 0, "repeats": 2, "confirm_top": 0}
    config["stop"] = {"max_trials": 1}
    config["cache_dir"] = str(tmp_path / "cache")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "QUANTUNE_REPORT": "0"}

    def run(config: str, out: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "quantune", "run", config, "-o", out]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    done = run("config.yaml", "out")
    assert done.returncode == 0, done.stderr
    assert "results: " in done.stdout  # the last lines printed were flushed
    log = (tmp_path / "out" / "quantune.log").read_text().strip().splitlines()
    assert "results written" in log[-1]  # the log file was flushed and closed
    assert json.loads((tmp_path / "out" / "results.json").read_text())["trials"]
    assert not (tmp_path / "out" / "run.db-wal").exists()  # the run store was closed, not abandoned
    bad = run("missing.yaml", "out2")
    assert bad.returncode == 2 and bad.stderr.startswith("quantune: error: ")
