"""Typed ``search.strategy_options``: a typo names the allowed keys in one line (exit 2); the schema lists them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from quantune.cli import main
from quantune.errors import ConfigError
from quantune.schema import config_json_schema
from quantune.strategy.options import QuantuneOptions
from quantune.strategy.registry import checked_options


def test_a_typo_names_the_allowed_options() -> None:
    with pytest.raises(ConfigError) as error:
        checked_options("quantune", {"screen_trial": 1})
    message = str(error.value)
    assert message.startswith("search.strategy_options.screen_trial:")
    assert "screen_trials" in message and "speed_margin" in message and "\n" not in message


def test_a_wrong_value_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"search\.strategy_options\.precisions\.0"):
        checked_options("basic", {"precisions": ["fp16"]})
    with pytest.raises(ConfigError, match="has no option 'screen_trials'"):
        checked_options("joint", {"screen_trials": 2})  # quantune's option, not the joint strategy's


def test_valid_options_are_the_typed_model_and_unknown_strategies_are_left_to_the_lookup() -> None:
    options = checked_options("quantune", {"drop_slow": False})
    assert isinstance(options, QuantuneOptions) and options.model_fields_set == {"drop_slow"}
    assert options.drop_slow is False and options.screen_trials == QuantuneOptions.model_fields["screen_trials"].default
    assert checked_options("not-registered", {"anything": 1}) == {"anything": 1}


def test_the_schema_lists_each_strategys_options() -> None:
    options = config_json_schema()["x-strategy-options"]
    assert set(QuantuneOptions.model_fields) <= set(options["quantune"]["properties"])
    assert "tuning_trials" in options["basic"]["properties"]
    assert options["joint"].get("properties", {}) == {}


def test_the_cli_exits_2_with_one_line(tmp_path: Path, make_config, capsys: pytest.CaptureFixture[str]) -> None:
    config = make_config(search={"strategy": "quantune", "strategy_options": {"speed_margn": 0.1}})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", str(path), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "speed_margn" in err[0] and "speed_margin" in err[0]
    assert not (tmp_path / "out" / "run.db").exists()
