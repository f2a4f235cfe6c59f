"""Session settings that travel with a model: a sidecar file ``<model>.session.json``, part of the candidate as much as
its weights. Every evaluation session reads it, the artifact cache hashes it, ``best/`` carries it, and it holds exactly
what ``open_session(..., settings=...)`` takes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SUFFIX = ".session.json"


def session_file(model: str | Path) -> Path:
    """Where ``model``'s session settings live: ``<model>.session.json``."""
    return Path(str(model) + SUFFIX)


def read_session_settings(model: str | Path | bytes) -> dict[str, Any] | None:
    """The settings stored beside ``model``, or ``None`` (no file, or a model given as bytes)."""
    if isinstance(model, bytes):
        return None
    path = session_file(model)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    settings = json.loads(text)
    if not isinstance(settings, dict):
        raise ValueError(f"{path}: expected a JSON object of session settings, got {type(settings).__name__}")
    return settings


def write_session_settings(model: str | Path, settings: dict[str, Any]) -> Path:
    """Writes ``settings`` beside ``model`` (sorted keys, so equal settings give equal bytes)."""
    path = session_file(model)
    path.write_text(json.dumps(settings, indent=1, sort_keys=True) + "\n")
    return path
