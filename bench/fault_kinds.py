"""A new user's probe (issue 26): ~100 kinds of bad input and fault through the real CLI.

Run: ``PYTHONPATH=src python bench/fault_kinds.py [--only WORD] [--write bench/fault_kinds.md]``
(also ``python bench/fault_soak.py --kinds``).

Each kind starts from a fresh copy of the bundled digits example (``examples/digits``, the
config a new user runs first, with ``stop.max_trials: 2``), breaks one thing -- the config, the
model, the data, a loader, metric or runner script, or the environment -- and runs ``python -m
quantune`` in a subprocess, as a user would. A kind passes when the command ends as it should:

- exit 2 with exactly one ``quantune: error:`` line on stderr naming the field or file at fault
  (exit 1 for a full disk), or exit 0 where the input is odd but valid (a warning may be said),
  or exit 130/143 for a run stopped by a signal (its kind checks what the run kept);
- never a ``Traceback``, and no file of the user's changed.

Prints a table and, with ``--write``, writes it as markdown with the count of kinds and of
tracebacks. Mount-based kinds (full and read-only disks) need root's right to mount a tmpfs;
without it they are reported as skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "examples" / "digits"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fault_kinds_end import END_KINDS  # noqa: E402
from fault_kinds_list import KINDS as LISTED  # noqa: E402

KINDS = [*LISTED, *END_KINDS]
SIGNAL_EXITS = (130, 143)  # stopped by Ctrl-C or SIGTERM: what is kept is checked after, no error line


@dataclass
class Project:
    """A fresh copy of the digits example and its config, in ``folder``."""

    folder: Path
    config: dict[str, Any] = field(default_factory=dict)
    mounts: list[Path] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def set(self, dotted: str, value: Any) -> Project:
        node = self.config
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
        return self

    def write(self, name: str, text: str | bytes) -> Path:
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
        return path

    def npz(self, name: str, **arrays: np.ndarray) -> str:
        np.savez(self.folder / name, **arrays)
        return name

    def eval_arrays(self) -> dict[str, np.ndarray]:
        with np.load(self.folder / "eval.npz") as data:
            return {key: data[key] for key in data.files}

    def save_config(self, name: str = "config.yaml") -> Path:
        return self.write(name, yaml.safe_dump(self.config, sort_keys=False))

    def mount(self, name: str, size: str, read_only: bool = False) -> Path | None:
        point = self.folder / name
        point.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True)
        if done.returncode != 0:
            return None
        self.mounts.append(point)
        return point

    def quantune(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "QUANTUNE_REPORT": "0", **self.env}
        command: list[str] | str = [sys.executable, "-m", "quantune", *args]
        if args and args[0] == "|head":  # the output piped into `head -c 10`, which closes it early
            command = f"'{sys.executable}' -m quantune {' '.join(args[1:])} | head -c 10"
        try:
            return subprocess.run(
                command,
                shell=isinstance(command, str),
                cwd=self.folder,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(exc.cmd, 124, str(exc.stdout or ""), f"timed out after {timeout:.0f} s")


@contextlib.contextmanager
def project(base: Path, name: str) -> Iterator[Project]:
    folder = base / name
    folder.mkdir(parents=True)
    for file in ("model.onnx", "calib.npz", "eval.npz"):
        shutil.copy(DIGITS / file, folder / file)
    config = yaml.safe_load((DIGITS / "config.yaml").read_text())
    config["evaluation"]["latency"] = {"warmup": 1, "repeats": 5, "threads": 1, "confirm_top": 0}
    config["stop"] = {"max_trials": 2}
    config["cache_dir"] = "cache"
    config["executor"] = {"kind": "inline"}
    made = Project(folder, config)
    try:
        yield made
    finally:
        for point in reversed(made.mounts):
            subprocess.run(["umount", "-l", str(point)], capture_output=True)


@dataclass
class Outcome:
    status: str  # ok, TRACEBACK, WRONG EXIT, NOT ONE LINE, NOT NAMED, USER FILE CHANGED, skipped
    code: int | None
    said: str


def judge(done: subprocess.CompletedProcess, codes: tuple[int, ...], names: tuple[str, ...]) -> Outcome:
    err = done.stderr.strip()
    said = next((line for line in err.splitlines() if line.startswith("quantune: error:")), "")
    said = said or next((line for line in err.splitlines() if line.startswith("quantune: warning:")), "")
    if "Traceback" in done.stdout + done.stderr:
        return Outcome("TRACEBACK", done.returncode, err.splitlines()[-1] if err else "")
    if done.returncode not in codes:
        return Outcome("WRONG EXIT", done.returncode, said or (err.splitlines()[-1] if err else "(nothing said)"))
    if done.returncode not in (0, *SIGNAL_EXITS):
        lines = [line for line in err.splitlines() if not line.startswith("quantune: warning:")]
        if len(lines) != 1 or not lines[0].startswith("quantune: error: "):
            return Outcome("NOT ONE LINE", done.returncode, " / ".join(lines)[:300])
        if names and not any(name in lines[0] for name in names):
            return Outcome("NOT NAMED", done.returncode, lines[0])
    elif names and not any(name in done.stdout + err for name in names):
        return Outcome("NOT NAMED", done.returncode, said)
    return Outcome("ok", done.returncode, said)


def run_kind(base: Path, index: int, kind: Any) -> Outcome:
    with project(base, f"{index:03d}") as made:
        args = kind.setup(made)
        if args is None:
            return Outcome("skipped", None, "needs a tmpfs mount (not permitted here)")
        user_files = {p: p.read_bytes() for p in made.folder.rglob("*") if p.is_file() and "cache" not in p.parts}
        if kind.own_out:
            user_files = {p: b for p, b in user_files.items() if made.folder / "out" not in p.parents}
        done = made.quantune(*args)
        outcome = judge(done, kind.codes, kind.names)
        if kind.after is not None and outcome.status == "ok":
            problem = kind.after(made, done)
            if problem:
                outcome = Outcome("AFTER: " + problem, done.returncode, outcome.said)
        changed = [
            p.name
            for p, data in user_files.items()
            if p.is_file() and p.read_bytes() != data and p.name not in kind.changing
        ]
        if changed and outcome.status == "ok":
            outcome = Outcome("USER FILE CHANGED", done.returncode, ", ".join(changed))
        return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run the kinds whose name or group holds this word")
    parser.add_argument("--write", type=Path, help="write the table as markdown here")
    args = parser.parse_args()
    kinds = [k for k in KINDS if not args.only or args.only in k.name or args.only in k.group]
    rows = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="quantune-kinds-") as tmp:
        for index, kind in enumerate(kinds, 1):
            outcome = run_kind(Path(tmp), index, kind)
            rows.append((index, kind, outcome))
            print(
                f"{index:3d} {outcome.status:12s} {kind.group:11s} {kind.name}: exit {outcome.code} {outcome.said[:150]}"
            )
    elapsed = time.perf_counter() - started
    counts: dict[str, int] = {}
    for _, _, outcome in rows:
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
    tracebacks = counts.get("TRACEBACK", 0)
    summary = (
        f"{len(rows)} kinds in {elapsed:.0f} s: "
        + ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        + f"; tracebacks: {tracebacks}"
    )
    print(summary)
    if args.write:
        args.write.write_text(markdown(rows, summary))
        print(f"wrote {args.write}")
    if any(outcome.status not in ("ok", "skipped") for _, _, outcome in rows):
        raise SystemExit(1)


def markdown(rows: list[tuple[int, Any, Outcome]], summary: str) -> str:
    lines = [
        "# Kinds of bad input and fault tried (issue 26)",
        "",
        "Written by `PYTHONPATH=src python bench/fault_kinds.py --write bench/fault_kinds.md` (the kinds are",
        "in `bench/fault_kinds_list.py`): each starts from a fresh copy of `examples/digits` (`stop.max_trials: 2`)",
        "and runs the real CLI in a subprocess. `ok`: the expected exit code, one `quantune: error:` line naming",
        "the field or file (exit 2; 1 for a full disk) or a finished run (exit 0), no traceback, no user file changed.",
        "",
        f"**{summary}**",
        "",
        "| # | group | kind | expected exit | got | result | what quantune said |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for index, kind, outcome in rows:
        said = outcome.said.replace("|", "\\|")[:220]
        codes = "/".join(str(c) for c in kind.codes)
        lines.append(f"| {index} | {kind.group} | {kind.name} | {codes} | {outcome.code} | {outcome.status} | {said} |")
    return "\n".join(lines) + "\n"


__all__ = ["Callable", "Project", "judge", "main", "markdown", "run_kind"]

if __name__ == "__main__":
    main()
