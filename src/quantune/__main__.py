"""``python -m quantune`` runs the CLI."""

from __future__ import annotations

from quantune.cli import entry

entry()
