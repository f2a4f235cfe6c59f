"""Fault soak (issue 11): kill a real ``quantune run`` at random and check that nothing is lost.

Run: ``PYTHONPATH=src python bench/fault_soak.py [--kills 20] [--worker-kills 6] [--seed 0]``

1. **SIGKILL soak**: the run's main process is killed with SIGKILL at ``--kills`` random
   moments (uniform in ``--window`` seconds after each start: during start-up, the baseline,
   trials, cache writes and run.db commits alike) and started again each time; it must end
   with the same trials (numbers, flows, parameters, status, accuracy and size) and the same
   best as an uninterrupted run of the same config, and leave no process behind after any
   kill. The objective is model size, so "the same best" does not hinge on latency noise.
2. **Worker kills** (OOM-like): while a run goes on, random worker processes are killed with
   SIGKILL; the run must complete with exactly max_trials trials, the killed ones recorded as
   failed ("worker crashed: killed (SIGKILL ...)") and every other one ok.

Prints a table: the fault, how often it was injected, how the run ended, what was lost.

3. **Kinds** (``--kinds``, issue 26): instead of the soak, ~100 kinds of bad input and fault (config,
   model, data, loader/metric/runner scripts, the environment) through the real CLI, each
   judged for exit code, one line naming the field or file, and no traceback:
   ``bench/fault_kinds.py`` (its list in ``bench/fault_kinds_list.py``; ``--write`` a table).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the real-process helpers the robustness tests use

from robust_helpers import alive, descendants, kill_session, make_project, quantune, start_run, stored_trials  # noqa: E402

LATENCY = {"metric": "top1", "latency": {"warmup": 1, "repeats": 300, "threads": 1, "confirm_top": 0}}


def _trials(results: dict) -> list[tuple]:
    """Each trial's identity and deterministic figures (latency is measured, so it differs)."""
    return [
        (
            t["number"],
            tuple(t["flow"]),
            json.dumps(t["params"], sort_keys=True),
            t["status"],
            t["metrics"].get("top1"),
            t["metrics"].get("size_bytes"),
        )
        for t in results["trials"]
    ]


def _best(results: dict) -> tuple:
    """The best's deterministic figures: trials tied on size and accuracy are ranked by their
    measured latency, so among ties the chosen number may differ between two runs."""
    best = results.get("best") or {}
    metrics = best.get("metrics") or {}
    return metrics.get("size_bytes"), metrics.get("top1")


def _wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [pid for pid in pids if alive(pid)]
        if not left:
            return []
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


def sigkill_soak(base: Path, kills: int, window: float, trials: int, rng: random.Random) -> dict:
    config = make_project(base / "project", max_trials=trials, evaluation=LATENCY, objective="size")
    reference_out = base / "reference"
    done = quantune("run", str(config), "--output", str(reference_out), "--quiet", cwd=config.parent)
    if done.returncode != 0:
        raise SystemExit(f"the uninterrupted run failed: {done.stderr}")
    reference = json.loads((reference_out / "results.json").read_text())

    # the soak run gets its own cache, so its trials really run (and are killed mid-work)
    data = config.read_text().replace("cache_dir: cache", "cache_dir: soak-cache")
    soak_config = config.with_name("soak.yaml")
    soak_config.write_text(data)
    output = base / "soak"
    injected = finished_early = 0
    orphans: list[int] = []
    stored_before_kill: list[int] = []
    while injected < kills:
        proc = start_run(soak_config, output)
        delay = rng.uniform(0.05, window)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=delay)
        if proc.poll() is not None:  # it finished (or failed) before the kill
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"a resumed run failed (exit {proc.returncode}): {err[-2000:]}")
            finished_early += 1
            break
        children = descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
        injected += 1
        orphans += _wait_gone(children)
        kill_session(proc.pid)  # nothing should be left; clean up if something is
        stored_before_kill.append(stored_trials(output))
    final = quantune("run", str(soak_config), "--output", str(output), "--quiet", cwd=config.parent)
    if final.returncode != 0:
        raise SystemExit(f"the final resume failed (exit {final.returncode}): {final.stderr[-2000:]}")
    results = json.loads((output / "results.json").read_text())
    same_trials = _trials(results) == _trials(reference)
    if not same_trials:
        differing = [pair for pair in zip(_trials(results), _trials(reference), strict=False) if pair[0] != pair[1]]
        print(f"differing trials (soak, reference): {differing[:5]}")
    same_best = _best(results) == _best(reference)
    same = same_trials and same_best
    return {
        "injected": injected,
        "finished_before_kill": finished_early,
        "stored_after_each_kill": stored_before_kill,
        "orphans_after_10s": len(orphans),
        "trials": len(results["trials"]),
        "reference_trials": len(reference["trials"]),
        "same_trials_params_best": same,
        "same_trials": same_trials,
        "same_best": same_best,
        "best": ((results.get("best") or {}).get("number"), (reference.get("best") or {}).get("number")),
    }


def _workers(pid: int) -> list[int]:
    found = []
    for child in descendants(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            found.append(child)
    return found


def worker_kills(base: Path, kills: int, trials: int, rng: random.Random) -> dict:
    slow = {"metric": "top1", "latency": {"warmup": 1, "repeats": 1500, "threads": 1, "confirm_top": 0}}
    config = make_project(
        base / "workers", max_trials=trials, evaluation=slow, executor={"kind": "process", "workers": 2}
    )
    output = base / "workers-out"
    proc = start_run(config, output)
    injected = 0
    try:
        while injected < kills and proc.poll() is None:
            time.sleep(rng.uniform(0.5, 2.0))
            if stored_trials(output) < 1:
                continue  # the workers are still starting
            workers = _workers(proc.pid)
            if not workers:
                continue
            os.kill(rng.choice(workers), signal.SIGKILL)
            injected += 1
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            kill_session(proc.pid)
    if not (output / "results.json").is_file():
        raise SystemExit(f"the run with worker kills ended without results (exit {proc.returncode}): {err[-3000:]}")
    results = json.loads((output / "results.json").read_text())
    failed = [t for t in results["trials"] if t["status"] == "failed"]
    killed = [t for t in failed if "SIGKILL" in (t.get("error") or "")]
    return {
        "exit": proc.returncode,
        "injected": injected,
        # a trial whose model an earlier one made is no trial of the budget (max_trials)
        "trials": sum("(duplicate of trial" not in (t.get("stage") or "") for t in results["trials"]),
        "failed": len(failed),
        "failed_by_sigkill": len(killed),
        "other_failures": [t.get("error") for t in failed if t not in killed],
        "ok": sum(t["status"] == "ok" for t in results["trials"]),
        "stderr_traceback": "Traceback" in err,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs of the main process")
    parser.add_argument("--window", type=float, default=4.0, help="seconds after a start within which it is killed")
    parser.add_argument("--trials", type=int, default=60, help="max_trials of the SIGKILL soak")
    parser.add_argument("--worker-kills", type=int, default=6)
    parser.add_argument("--worker-trials", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", action="store_true", help="run bench/fault_kinds.py's kinds instead of the soak")
    args, rest = parser.parse_known_args()
    if args.kinds:
        import fault_kinds

        sys.argv = [sys.argv[0], *rest]  # e.g. --only data --write bench/fault_kinds.md
        fault_kinds.main()
        return
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="quantune-soak-") as tmp:
        base = Path(tmp)
        started = time.perf_counter()
        soak = sigkill_soak(base, args.kills, args.window, args.trials, rng)
        print(f"SIGKILL soak: {soak}", flush=True)
        soak_s = time.perf_counter() - started
        started = time.perf_counter()
        workers = worker_kills(base, args.worker_kills, args.worker_trials, rng)
        workers_s = time.perf_counter() - started
    lost_soak = "nothing" if soak["same_trials_params_best"] and not soak["orphans_after_10s"] else "MISMATCH"
    lost_workers = (
        "nothing"
        if workers["exit"] == 0
        and workers["trials"] == args.worker_trials
        and not workers["other_failures"]
        and workers["failed_by_sigkill"] <= workers["injected"]
        else "MISMATCH"
    )
    rows = [
        ("fault", "injected", "how it ended", "lost"),
        (
            "SIGKILL of the run, resumed each time",
            f"{soak['injected']} kills",
            f"{soak['trials']}/{soak['reference_trials']} trials, same trials/params/best: "
            f"{soak['same_trials_params_best']}, orphans: {soak['orphans_after_10s']} ({soak_s:.0f} s)",
            lost_soak,
        ),
        (
            "SIGKILL of workers (OOM-like)",
            f"{workers['injected']} kills",
            f"exit {workers['exit']}, {workers['trials']} trials: {workers['ok']} ok, "
            f"{workers['failed_by_sigkill']} failed by SIGKILL, other failures: {len(workers['other_failures'])} "
            f"({workers_s:.0f} s)",
            lost_workers,
        ),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for index, row in enumerate(rows):
        print(" | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if index == 0:
            print("-+-".join("-" * width for width in widths))
    print(f"trials stored after each kill: {soak['stored_after_each_kill']}")
    if workers["other_failures"]:
        print(f"other failures: {workers['other_failures']}")
    if "MISMATCH" in (lost_soak, lost_workers):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
