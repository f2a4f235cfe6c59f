"""quantune's side of a target environment: one evaluation server process, isolated.

The client starts the server (``target_server.py``) lazily and guards every request as trial
workers are guarded: a time limit, an address-space limit, and a crash becomes a
:class:`TargetFault` naming the cause and the last line of the target's log, which fails the
trial while the next request starts a fresh server. The server watches its parent, so a killed
run leaves no target behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from quantune.errors import TrialError

SERVER = Path(__file__).with_name("target_server.py")
_START_TIMEOUT_S = 120.0


class TargetFault(TrialError):
    """The target process died, hung or answered with an error: the evaluation fails, the run goes on."""


class TargetUnavailable(Exception):
    """The target cannot start at all (no interpreter, no onnxruntime there)."""


def _cause(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _limits(memory_limit_mb: int | None):
    def apply() -> None:
        os.setsid()  # its own process group: a Ctrl-C to the run's group is the engine's to handle
        if memory_limit_mb:
            import resource

            limit = int(memory_limit_mb) * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


class TargetClient:
    """One server under ``python``; requests are answered in order, one at a time."""

    def __init__(
        self, python: str, log_path: Path, *, timeout_s: float = 600.0, memory_limit_mb: int | None = None
    ) -> None:
        self.python = python
        self.log_path = Path(log_path)
        self.timeout_s = timeout_s
        self.memory_limit_mb = memory_limit_mb
        self.process: subprocess.Popen[bytes] | None = None
        self._greeted = False  # the running server's hello was read
        self._offset = 0  # its log's length when it started
        # one caller's sequence of requests at a time (load, time, free)
        self.lock = threading.RLock()

    def _environment(self) -> dict[str, str]:
        """This environment; for another interpreter without PYTHONPATH and user site packages."""
        if self.python == sys.executable:
            return dict(os.environ)
        return {**os.environ, "PYTHONNOUSERSITE": "1", "PYTHONPATH": ""}

    # -- process -------------------------------------------------------------------------------
    def _spawn(self, *args: str) -> subprocess.Popen[bytes]:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(
                [self.python, str(SERVER), *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                preexec_fn=_limits(self.memory_limit_mb),
                env=self._environment(),
            )

    def _respawn(self) -> None:
        self.stop()
        self._offset = self.log_offset()
        self.process = self._spawn()
        self._greeted = False

    def start(self) -> None:
        if self.process is None or self.process.poll() is not None:
            try:
                self._respawn()
            except OSError as exc:  # no such interpreter, not executable
                raise TargetUnavailable(f"cannot start {self.python}: {exc.strerror or exc}") from None
        if self._greeted:
            return
        try:
            hello = self._read(_START_TIMEOUT_S, self._offset)
        except TargetFault as exc:
            self.stop()
            raise TargetUnavailable(str(exc)) from None
        if "error" in hello:
            self.stop()
            raise TargetUnavailable(f"onnxruntime is not importable in {self.python}: {hello['error']}")
        self._greeted = True

    def launch(self) -> None:
        """Starts the server without waiting, so its start overlaps the caller's work."""
        if self.process is None or self.process.poll() is not None:
            with contextlib.suppress(OSError):
                self._respawn()

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            if process.stdin:
                process.stdin.close()
        try:
            process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        if process.stdout:
            process.stdout.close()

    def log_offset(self) -> int:
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def tail(self, offset: int, lines: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(offset)
                text = handle.read().decode(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def _crashed(self, code: int | None, offset: int) -> TargetFault:
        tail = self.tail(offset)
        last = f"; its log ends with: {tail.splitlines()[-1]}" if tail else ""
        return TargetFault(f"target crashed: {self.python} {_cause(code)}{last}")

    # -- requests ------------------------------------------------------------------------------
    def _read(self, timeout_s: float | None, offset: int) -> dict[str, Any]:
        process = self.process
        assert process is not None and process.stdout is not None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([process.stdout], [], [], remaining)
            if ready:
                line = process.stdout.readline()
                if line:
                    return json.loads(line)
                process.wait(timeout=10)  # end of file: the server is gone
                self.process = None
                raise self._crashed(process.returncode, offset)
            if deadline is not None and time.monotonic() >= deadline:
                process.kill()
                self.stop()
                raise TargetFault(f"target timeout: {self.python} took longer than {timeout_s:g} s and was killed")

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """The server's answer to ``op``; a :class:`TargetFault` if it errs, dies or hangs."""
        try:
            self.start()
        except TargetUnavailable as exc:
            raise TargetFault(f"target unavailable: {exc}") from None
        assert self.process is not None and self.process.stdin is not None
        offset = self.log_offset()
        try:
            self.process.stdin.write((json.dumps({"op": op, **fields}) + "\n").encode())
            self.process.stdin.flush()
        except OSError:
            pass  # it died: reading says how
        answer = self._read(self.timeout_s, offset)
        if "error" in answer:
            raise TargetFault(f"target: {answer['error']}")
        return answer

    def one_shot(self, request_path: Path, *, timeout_s: float | None = None) -> dict[str, Any]:
        """``--memory REQUEST``: a fresh server process answers once and ends (same limits)."""
        offset = self.log_offset()
        try:
            process = self._spawn("--memory", str(request_path))
        except OSError as exc:
            raise TargetFault(f"target unavailable: cannot start {self.python}: {exc.strerror or exc}") from None
        try:
            out, _ = process.communicate(timeout=timeout_s or self.timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            limit = timeout_s or self.timeout_s
            raise TargetFault(f"target timeout: measuring memory took longer than {limit:g} s") from None
        lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
        if process.returncode != 0 or not lines:
            raise self._crashed(process.returncode, offset)
        answer = json.loads(lines[-1])
        if "error" in answer:
            raise TargetFault(f"target: {answer['error']}")
        return answer
