"""Failures that teach: a failed trial's cause as a class, and the points that share it.

:func:`classify` turns an error into the place plus the kind of error, with names and numbers
replaced by placeholders, so the same cause on different nodes is one class.
:class:`KnownFailures` learns per class the steps and shared searched values of the failing
points, and skips proposals that match (never covering a point that ran fine). It learns in
the order trials were told, so a resumed run skips exactly what the original run skipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

EVALUATION = "evaluation"
WORKER = "worker"
_MAX_MESSAGE = 160

_PASS_FAILED = re.compile(r"^(?:TrialError: )?pass '(?P<step>[^']+)' (?:failed: )?(?P<rest>.*)$", re.S)
_WORKER_PREFIXES = (
    ("worker crashed: ", "crashed: "),
    ("worker could not run the trial: ", "could not run the trial: "),
    ("executor error: ", "executor error: "),
)
_OOM_SIGNS = ("out of memory", "MemoryError", "bad_alloc", "Failed to allocate")
# What varies between points failing for one reason: quoted or bare names with digits, paths, numbers.
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b")
_PATH = re.compile(r"(?<![\w<])(?:[A-Za-z]:)?(?:[\w.-]*/)+[\w.<>-]*")
_NAMED = re.compile(r"(?<![\w<])[\w.:-]*[A-Za-z_][\w.:-]*\d[\w.:-]*|(?<![\w<])\d[\w.:-]*[A-Za-z_][\w.:-]*")
_NUMBER = re.compile(r"(?<![\w<])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w>])")


def normalise(message: str) -> str:
    """``message``'s first line with its varying parts as ``<name>``, ``<path>`` and ``<n>``."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    text = _HEX.sub("<addr>", text)
    text = _PATH.sub(lambda m: "<name>" if m.group(0).startswith("/") and "." not in m.group(0) else "<path>", text)
    text = _NUMBER.sub("<n>", text)
    text = _NAMED.sub("<name>", text)
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def classify(error: str | None) -> str:
    """The failure class of a failed trial's ``error`` (``TrialRecord.error``)."""
    text = (error or "").strip()
    if not text:
        return f"{WORKER}: failed without an error message"
    if text.startswith("timeout:"):
        return f"{WORKER}: timeout"
    if text.startswith("out of memory"):
        return f"{WORKER}: out of memory"
    for prefix, kind in _WORKER_PREFIXES:
        if text.startswith(prefix):
            return f"{WORKER}: {kind}{normalise(text[len(prefix) :])}"
    matched = _PASS_FAILED.match(text)
    if matched:
        where, rest = matched.group("step"), matched.group("rest")
    else:
        where, rest = EVALUATION, text.removeprefix("TrialError: ")
    if any(sign in rest for sign in _OOM_SIGNS):
        return f"{where}: out of memory"
    return f"{where}: {normalise(rest)}"


classify_failure = classify  # the name the package exports


def failed_step(failure_class: str, flow: list[str] | tuple[str, ...]) -> str | None:
    """The step a class names, when it is one of ``flow``'s (else the evaluation or the worker)."""
    where = failure_class.partition(":")[0]
    return where if where in flow else None


@dataclass
class Signature:
    """Steps run (a prefix of the flow, or the whole flow when ``exact``) plus shared values."""

    steps: tuple[str, ...]
    exact: bool
    values: dict[str, Any]
    failures: int = 1

    def matches(self, flow: tuple[str, ...], values: Mapping[str, Any]) -> bool:
        if tuple(flow[: len(self.steps)]) != self.steps or (self.exact and len(flow) != len(self.steps)):
            return False
        return all(key in values and values[key] == value for key, value in self.values.items())

    def merged(self, other: Signature) -> Signature | None:
        if (self.steps, self.exact) != (other.steps, other.exact):
            return None
        shared = {k: v for k, v in self.values.items() if k in other.values and other.values[k] == v}
        return Signature(self.steps, self.exact, shared, self.failures + other.failures)


def flat_values(point: Mapping[str, Any], steps: tuple[str, ...]) -> dict[str, str]:
    """``point``'s values of ``steps``' parameters (``<step>.<param>`` keys), as canonical JSON
    text: a joint value is the same whether it is a tuple or came back from the run store a list."""
    prefixes = tuple(f"{step}." for step in steps)
    return {
        key: json.dumps(value, sort_keys=True, default=str) for key, value in point.items() if key.startswith(prefixes)
    }


@dataclass
class KnownFailures:
    """Signatures learnt from the failed trials of one run, in the order they were told."""

    _failures: dict[str, list[Signature]] = field(default_factory=dict)  # class -> one entry per failed trial
    _signatures: dict[str, list[Signature]] = field(default_factory=dict)  # class -> what is skipped
    _successes: list[tuple[tuple[str, ...], dict[str, Any]]] = field(default_factory=list)

    def learn(self, flow: list[str] | tuple[str, ...], point: Mapping[str, Any], failure_class: str | None) -> None:
        """Adds a finished trial: a failure of ``failure_class``, or (``None``) one that ran."""
        flow = tuple(flow)
        if failure_class is None:
            values = flat_values(point, flow)
            self._successes.append((flow, values))
            for name, signatures in self._signatures.items():
                if any(sig.matches(flow, values) for sig in signatures):
                    self._rebuild(name)  # this point ran: the widest signature was too wide
            return
        step = failed_step(failure_class, flow)
        steps = flow[: flow.index(step) + 1] if step is not None else flow
        entry = Signature(steps, exact=step is None, values=flat_values(point, steps))
        self._failures.setdefault(failure_class, []).append(entry)
        self._rebuild(failure_class)

    def _rebuild(self, failure_class: str) -> None:
        signatures: list[Signature] = []
        for entry in self._failures[failure_class]:
            for index, signature in enumerate(signatures):
                merged = signature.merged(entry)
                if merged is not None and not any(merged.matches(f, v) for f, v in self._successes):
                    signatures[index] = merged
                    break
            else:
                signatures.append(Signature(entry.steps, entry.exact, dict(entry.values)))
        self._signatures[failure_class] = signatures

    def match(self, flow: tuple[str, ...], point: Mapping[str, Any]) -> str | None:
        """The known failure class a proposal (``flow``, ``point``) would fail with, or ``None``."""
        values = flat_values(point, tuple(flow))
        for name, signatures in self._signatures.items():
            if any(sig.matches(tuple(flow), values) for sig in signatures):
                return name
        return None

    def signatures(self, failure_class: str) -> list[Signature]:
        return list(self._signatures.get(failure_class, []))
