"""Typed ``search.strategy_options``: a typo names the allowed keys in one line (exit 2); the schema lists them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

import quantune
from conftest import accuracy_problem
from quantune.cli import main
from quantune.errors import ConfigError
from quantune.schema import config_json_schema
from quantune.strategy import create_strategy
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


def test_a_strategy_reads_its_validated_options_with_the_defaults_filled(make_config) -> None:
    config = make_config([{"name": "static_quant", "search": True}], search={"strategy": "quantune"})
    problem = accuracy_problem(config, {"screen_trials": 1})
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    assert isinstance(problem.options, QuantuneOptions) and strategy.options is problem.options
    assert strategy.options.screen_trials == 1 and strategy.options.speed_margin == QuantuneOptions().speed_margin
    assert strategy.ctx.options is problem.options  # the accuracy context reads the same model
    with pytest.raises(ConfigError, match=r"strategy_options\.screen_trial: .*has no option"):
        strategy.bind(dataclasses.replace(problem, options={"screen_trial": 1}))  # a plain mapping is checked too


def test_no_strategy_option_default_is_written_twice() -> None:
    """Strategies read their options' typed fields: a default lives only in strategy/options.py."""
    root = Path(quantune.__file__).parent / "strategy"
    found = [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "options.get(" in line
    ]
    assert not found
