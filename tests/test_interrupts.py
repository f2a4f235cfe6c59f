"""Ctrl-C is deferred only while a finished trial is being recorded."""

from __future__ import annotations

import signal

import pytest

from quantune.engine.interrupts import DeferredInterrupt


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
