"""Whole-run time, trials and stop reason of the ``quantune`` strategy, for two source trees side by side.

Issue 23 ("answer as soon as the answer is known"): a run should end when a model in budget is
at the speed ceiling, and its latency stage should not spend trials on timing noise. This
runs one config with each tree's code (``--tree NAME=PATH/src``), each run in its own process
from process start (``python -m quantune run``) with a cold cache, alternating trees so a slow
minute of this shared machine lands on both, and prints one row per run: wall seconds, trials
(duplicates of an earlier model not counted), the first in-budget trial, the final trial, the
verdict and the stop reason. Speed of the final models is not compared here (the run's own
side-by-side confirmation says that, in each results.json).

    python bench/answer_early.py examples/digits/config.yaml --tree main=/work/main/src \\
        --tree answer=src --repeats 2 --set search.strategy=quantune
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path


def run_once(config: Path, src: str, sets: list[str], work: Path) -> dict:
    out, cache = work / "out", work / "cache"
    command = [sys.executable, "-m", "quantune", "run", str(config), "-o", str(out), "-q"]
    command += [arg for item in [*sets, f"cache_dir={cache}"] for arg in ("--set", item)]
    env = {**os.environ, "PYTHONPATH": src, "QUANTUNE_REPORT": "0"}
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    path = out / "results.json"
    if not path.exists():
        return {"wall_s": wall, "error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    result = json.loads(path.read_text())
    trials = result["trials"]
    spent = [t for t in trials if "duplicate of trial" not in (t.get("stage") or "")]
    meeting = [t["number"] for t in trials if t.get("meets_criterion")]
    best = result.get("best") or {}
    return {
        "wall_s": wall,
        "after_first_s": _after_first(out / "quantune.log", min(meeting) if meeting else None),
        "trials": len(spent),
        "first_in_budget": min(meeting) if meeting else None,
        "final": best.get("number"),
        "final_params": best.get("params"),
        "verdict": result.get("verdict"),
        "stop_reason": result.get("stop_reason"),
    }


def _after_first(log: Path, first: int | None) -> float | None:
    """Seconds from the first in-budget trial's record to the search's end, from the run's log (the
    search after the answer was known; start-up and the confirmation are outside it)."""
    if first is None or not log.exists():
        return None
    stamps = {}
    for line in log.read_text().splitlines():
        for name, marker in (("first", f"INFO quantune: trial {first}: "), ("end", "INFO quantune: search stopped")):
            if marker in line and name not in stamps:
                stamps[name] = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    if len(stamps) < 2:
        return None
    return (stamps["end"] - stamps["first"]).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH of a src folder")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], dest="sets", help="a quantune run --set KEY=VALUE")
    args = parser.parse_args()
    trees = [item.split("=", 1) for item in args.tree]
    rows = []
    for repeat in range(args.repeats):
        for name, src in trees:
            with tempfile.TemporaryDirectory() as work:
                row = run_once(args.config.resolve(), str(Path(src).resolve()), args.sets, Path(work))
            rows.append({"tree": name, "repeat": repeat, **row})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(
        "| tree | run | whole run (s) | search after first in budget (s) | trials | first in budget | final | verdict | stop reason |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        if "error" in row:
            print(f"| {row['tree']} | {row['repeat']} | {row['wall_s']:.1f} | failed: {row['error']} | | | | | |")
            continue
        print(
            f"| {row['tree']} | {row['repeat']} | {row['wall_s']:.1f} | {_num(row['after_first_s'])} | {row['trials']} "
            f"| {row['first_in_budget']} "
            f"| {row['final']} | {row['verdict']} | {row['stop_reason']} |"
        )


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    main()
