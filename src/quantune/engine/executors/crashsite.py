"""Where a worker crashed, from faulthandler's report in its log: the user's file and line.

The innermost frame outside Python, installed packages and quantune is the user's call that
crashed: naming it turns the crash into a line the user can act on.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = ("Current thread", "Stack (most recent call first)")
_NOT_USERS = tuple(
    str(Path(p).resolve())
    for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(__file__).resolve().parents[2])}
)


def _users(file: str) -> bool:
    if file.startswith("<"):
        return False
    try:
        resolved = str(Path(file).resolve())
    except OSError:
        return False
    return not resolved.startswith(_NOT_USERS)


def crash_site(log_text: str) -> str:
    """``" in FILE, line N (function)"`` for the innermost user frame of the crashing thread in
    faulthandler's report within ``log_text``, or ``""`` when there is none."""
    lines = log_text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(_THREAD)]
    if not starts:
        return ""
    for line in lines[starts[-1] + 1 :]:
        matched = _FRAME.match(line)
        if matched is None:
            if not line.strip():
                break
            continue
        if _users(matched["file"]):
            return f" in {matched['file']}, line {matched['line']} ({matched['func']})"
    return ""


def log_since(path: Path, offset: int) -> str:
    """The text of the log at ``path`` from byte ``offset`` ("" when it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace")
    except OSError:
        return ""
