"""Ctrl-C is deferred only while a finished trial is being recorded."""

from __future__ import annotations

import signal

import pytest

from quantune.engine.run.interrupts import DeferredInterrupt


def _ctrl_c() -> None:
    signal.raise_signal(signal.SIGINT)  # as a Ctrl-C would: the Python handler runs right after


def test_ctrl_c_inside_a_critical_block_waits_for_its_end():
    reached_end = False
    with pytest.raises(KeyboardInterrupt), DeferredInterrupt() as interrupts, interrupts.critical():
        _ctrl_c()
        for _ in range(1000):  # handlers run between bytecodes: give it plenty
            pass
        reached_end = True
    assert reached_end


def test_ctrl_c_outside_a_critical_block_is_immediate():
    after = False
    with pytest.raises(KeyboardInterrupt), DeferredInterrupt():
        _ctrl_c()
        for _ in range(1000):
            pass
        after = True
    assert not after


def test_the_previous_handler_comes_back_and_ignored_ctrl_c_stays_ignored():
    before = signal.getsignal(signal.SIGINT)
    with DeferredInterrupt():
        assert signal.getsignal(signal.SIGINT) is not before
    assert signal.getsignal(signal.SIGINT) is before
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with DeferredInterrupt():
            _ctrl_c()
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_stop_the_code_it_landed_in_swallowed_still_stops_the_run() -> None:
    """A signal raises its interrupt wherever the main thread is; a library's clean-up may turn it
    into an error that a caller catches (a file lock's release raising OSError in its place). The
    stop is kept until the engine takes it, so the next stop point raises it again."""
    import contextlib

    from quantune.engine.run import interrupts

    previous = signal.signal(signal.SIGTERM, interrupts._raise_stop)
    try:
        with contextlib.suppress(KeyboardInterrupt):  # swallowed, as around a lock's clean-up
            signal.raise_signal(signal.SIGTERM)
        with pytest.raises(interrupts.Terminated):
            interrupts.raise_if_stopped()
        interrupts.stop_taken()  # the engine caught it and saves what finished
        interrupts.raise_if_stopped()  # taken: no second stop
    finally:
        signal.signal(signal.SIGTERM, previous)
        interrupts.stop_taken()
