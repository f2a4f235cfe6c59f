"""The package version, on its own so low-level modules (machine facts) need not import the package root."""

from __future__ import annotations

__version__ = "0.2.0"  # as pyproject.toml
