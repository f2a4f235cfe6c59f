"""A crash of user code in quantune's own process, said in one line by a witness process.

No handler survives a segmentation fault in the main process, so while user code runs,
faulthandler writes into a pipe read by a tiny witness process that prints one line naming
the script when the process dies. The exit status stays the crash's.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import subprocess
import sys
from collections.abc import Iterator

_WITNESS = r"""
import re, sys
prefix, script = sys.argv[1], sys.argv[2]
text = sys.stdin.buffer.read().decode(errors="replace")
if text.strip():
    lines = text.splitlines()
    what = next((l.split(":", 1)[1].strip() for l in lines if l.startswith("Fatal Python error:")), "a crash")
    where = ""
    for l in lines:
        m = re.match(r'\s*File "(.+)", line (\d+) in (\S+)', l)
        if m and m.group(1) == script:
            where = " at line %s in %s()" % (m.group(2), m.group(3))
            break
    sys.stderr.write("quantune: error: %s%s: %s (it ended quantune's process)\n" % (prefix, where, what))
"""


@contextlib.contextmanager
def crash_witness(prefix: str, source_file: str) -> Iterator[None]:
    """While the block runs, a crash of this process is reported as ``prefix`` plus where in
    ``source_file`` it happened; without faulthandler or a witness, the block just runs."""
    if faulthandler.is_enabled():
        yield
        return
    read_fd, write_fd = os.pipe()
    try:
        witness = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _WITNESS, prefix, source_file],
            stdin=read_fd,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to quantune's process group is not the witness's
        )
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        yield
        return
    os.close(read_fd)
    sink = os.fdopen(write_fd, "wb", buffering=0)
    faulthandler.enable(file=sink, all_threads=False)
    try:
        yield
    finally:
        faulthandler.disable()
        sink.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            witness.wait(timeout=10)
