"""The informational commands: schema, passes, space."""

from __future__ import annotations

import json
import re

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
