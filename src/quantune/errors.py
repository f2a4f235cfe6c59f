"""Errors a user can act on.

Everything a user can get wrong (a config field, a data file, a model that does not load)
raises :class:`QuantuneError` with a message that names the place and what would be right.
The CLI turns these into one line on stderr and exit code 2; anything else is a bug in
quantune and keeps its traceback.
"""

from __future__ import annotations


class QuantuneError(Exception):
    """A mistake in what the user gave quantune (config, data, model)."""


class ConfigError(QuantuneError):
    """The config does not validate; the message names the field path."""

    def __init__(self, message: str, *, source: str | None = None) -> None:
        self.source = source
        super().__init__(f"{source}: {message}" if source else message)


class EnvironmentFault(Exception):
    """The machine, not the user's input, stopped the run (a full disk): one line, exit 1; the same
    run succeeds once the cause is gone."""


class DiskFull(EnvironmentFault):
    """No space left on the device holding the output folder or the cache."""

    def __init__(self, path: object) -> None:
        self.path = str(path)
        super().__init__(f"No space left on device writing {path}")


class TrialError(Exception):
    """A pass or an evaluation failed inside one trial; the run records it and goes on."""
