"""Overriding fields of a config file without editing it: ``--set stop.max_trials=5``.

Overrides apply to the file's raw mapping before validation, so the result is checked exactly
like the file and its relative paths stay relative to the file's folder.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import yaml

from quantune.errors import ConfigError


def parse_set(items: list[str] | None) -> dict[str, Any]:
    """``["stop.max_trials=5", "search.sampler=random"]`` -> ``{"stop.max_trials": 5, ...}``.

    A value is read as a YAML scalar or flow collection (``5``, ``true``, ``null``, ``[a, b]``,
    ``{level: all}``), as it would be in the file; quote it to keep a string (``--set x='5'``).
    """
    overrides: dict[str, Any] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {item}: expected KEY=VALUE, e.g. --set stop.max_trials=5")
        try:
            overrides[key] = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
            raise ConfigError(f"--set {key}: the value '{text}' is not valid YAML ({problem})") from None
    return overrides


def override_label(key: str, cli: bool) -> str:
    """How an override is named in messages: as the user wrote it."""
    return f"--set {key}" if cli else f"overrides['{key}']"


def apply_overrides(raw: Mapping[str, Any], overrides: Mapping[str, Any], *, cli: bool = False) -> dict[str, Any]:
    """A deep copy of ``raw`` with each dotted ``key`` set to its value; list items are named by
    index (``passes.0.params.per_channel``). Missing sections are created; what a key walks
    through must be a mapping (or a list, for an index)."""
    result: dict[str, Any] = copy.deepcopy(dict(raw))
    for key, value in overrides.items():
        if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"{override_label(str(key), cli)}: a key is dotted field names, e.g. stop.max_trials")
        parts = key.split(".")
        node: Any = result
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            where = ".".join(parts[:depth]) or "the top level"
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(
                        f"{override_label(key, cli)}: '{where}' is a list of {len(node)}; name an item by its index "
                        f"0..{len(node) - 1}"
                    )
                index = int(part)
                if last:
                    node[index] = value
                else:
                    node = node[index]
                continue
            if not isinstance(node, dict):
                raise ConfigError(
                    f"{override_label(key, cli)}: '{where}' is {type(node).__name__} ({node!r}), not a section with "
                    "fields"
                )
            if last:
                node[part] = value
            else:
                if node.get(part) is None:
                    node[part] = {}
                node = node[part]
    return result


def blame(location: str, overrides: Mapping[str, Any], cli: bool) -> str | None:
    """The override a validation error at ``location`` (dotted) comes from, as the user named it
    (with the field, when the error is inside the value set: ``--set stop (stop.max_trials)``)."""
    for key in overrides:
        if location == key or key.startswith(location + "."):
            return override_label(key, cli)
        if location.startswith(key + "."):
            return f"{override_label(key, cli)} ({location})"
    return None
