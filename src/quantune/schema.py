"""The config's JSON Schema with every registered strategy's options (``quantune schema``, editors);
above both halves it joins, so the config package never imports the strategies."""

from __future__ import annotations

from typing import Any

from quantune.config.schema import Config
from quantune.strategy.registry import options_json_schemas


def config_json_schema() -> dict[str, Any]:
    """The config's JSON Schema; ``x-strategy-options`` holds each registered strategy's options."""
    schema = Config.model_json_schema()
    schema["x-strategy-options"] = options_json_schemas()
    return schema
