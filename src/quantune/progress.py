"""Progress of long stages as events: a stage says how far it is, whoever listens shows it.

Stages only :func:`tick` (done, total); the console shows the events and a stage worker
forwards them through its pipe, so a stage reports alike wherever it runs. Nothing listens by
default.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """How far a stage is: ``done`` of ``total`` units (``None``: unknown), ``elapsed_s`` since it began."""

    stage: str
    done: int
    total: int | None
    elapsed_s: float
    unit: str = ""
    note: str = ""  # what else a person would want to know (the best trial so far)


Listener = Callable[[Step], None]
_LISTENERS: list[Listener] = []
_LOCK = threading.Lock()
_STAGE: ContextVar[tuple[str, float] | None] = ContextVar("quantune_progress_stage", default=None)


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """``listener`` gets every event reported in this process while the block runs."""
    with _LOCK:
        _LISTENERS.append(listener)
    try:
        yield
    finally:
        with _LOCK:
            _LISTENERS.remove(listener)


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Names the stage that :func:`tick` reports for (a timing loop does not know whose rounds it
    times); its clock starts here. The stage reports its start and its end."""
    token = _STAGE.set((name, time.perf_counter()))
    if _LISTENERS:
        forward(Step(name, 0, None, 0.0))
    try:
        yield
    finally:
        current = _STAGE.get()
        _STAGE.reset(token)
        if current is not None:
            forward(Step(name, -1, None, time.perf_counter() - current[1]))


def tick(done: int, total: int | None, unit: str = "") -> None:
    """``done`` of ``total`` units of the current :func:`stage` (none named: no event)."""
    current = _STAGE.get()
    if current is not None and _LISTENERS:
        forward(Step(current[0], done, total, time.perf_counter() - current[1], unit))


def forward(step: Step) -> None:
    """An event (``done`` 0 and no ``total``: the stage began; -1: it ended) to this process's listeners."""
    with _LOCK:
        listeners = list(_LISTENERS)
    for listener in listeners:
        listener(step)
