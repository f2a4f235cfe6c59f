"""User code that ends the process instead of returning: one line naming the script, not a silent exit.

Functions from user scripts are called through :class:`Guarded`: ``SystemExit``, and
``os._exit`` while (and only while) the calling thread runs user code, become a
:class:`~quantune.errors.QuantuneError` naming the script; ``faulthandler`` is on meanwhile so
a segmentation fault's report names the script's line.
"""

from __future__ import annotations

import faulthandler
import functools
import multiprocessing
import os
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from quantune.errors import QuantuneError
from quantune.userfault import crash_witness

_REAL_EXIT = REAL_EXIT = os._exit  # (a watchdog's exit must never be taken for user code's)
_IN_USER_CODE: set[tuple[int, int]] = set()  # (pid, thread id) running user code now


class _ExitCalled(BaseException):
    """``os._exit`` called by user code (a BaseException: ``except Exception`` in it does not swallow it)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _exit(code: int) -> NoReturn:
    if (os.getpid(), threading.get_ident()) in _IN_USER_CODE:
        raise _ExitCalled(code)
    _REAL_EXIT(code)


class Guarded:
    """``func`` from the user's ``script`` (named in config field ``field_name``), called so that
    ending the process is reported instead of done."""

    def __init__(self, func: Callable[..., Any], field_name: str, script: str) -> None:
        self.func = func
        self.field_name = field_name
        self.script = script
        functools.update_wrapper(self, func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        me = (os.getpid(), threading.get_ident())
        outermost = me not in _IN_USER_CODE
        witnessed = outermost and self._in_main_process()
        fault_report = outermost and not witnessed and not faulthandler.is_enabled()
        os._exit = _exit
        _IN_USER_CODE.add(me)
        if fault_report:
            faulthandler.enable()
        try:
            if witnessed:  # a crash here ends quantune's own process: a witness says where (userfault.py)
                source = getattr(getattr(self.func, "__code__", None), "co_filename", self.script)
                with crash_witness(f"{self.field_name}: '{self.script}' crashed Python", source):
                    return self.func(*args, **kwargs)
            return self.func(*args, **kwargs)
        except SystemExit as exc:
            raise self._ended(f"sys.exit({exc.code!r})") from None
        except _ExitCalled as exc:
            raise self._ended(f"os._exit({exc.code!r})") from None
        finally:
            if outermost:
                _IN_USER_CODE.discard(me)
            if fault_report:
                faulthandler.disable()

    def _in_main_process(self) -> bool:
        """A loader, model builder or metric in quantune's own process (not a worker, whose crash its
        parent reports; never a runner, whose calls are timed)."""
        fields = ("data.", "model.", "evaluation.metric")
        return self.field_name.startswith(fields) and multiprocessing.parent_process() is None

    def _ended(self, call: str) -> QuantuneError:
        name = getattr(self.func, "__name__", "the function")
        return QuantuneError(
            f"{self.field_name}: '{self.script}' called {call} in {name}(); it must return its result, "
            "not end the process"
        )
