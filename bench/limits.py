"""Does ``stop.timeout_s: T`` mean what it says? Each case run cold at each T, wall time against T.

    python bench/limits.py [--models digits,ppocr_cls,...] [--timeouts 60,120,240] [--repeat N]
                           [--max-trials 200] [--out bench/results] [--render limits-<date>.json]

A case is a zoo model (``bench/zoo/run.py --list``) or ``digits`` (examples/digits/config.yaml).
Each (case, T) runs ``quantune run`` in its own process on a copy of the case's config with
``stop.timeout_s: T`` and ``stop.max_trials`` large (so the limit is what stops it), in a
temporary folder of links to the case's files, with a quantune cache of its own (cold: a warm
cache would replay trials and the limit would describe the cache). Recorded per run: the
process's wall time from start to exit and its ratio to T (held when <= 1.05), trials run,
verdict, whether an ``improved`` answer was confirmed side by side, whether report.html was
written, the stop reason and the console's ``time:`` line. ``--repeat N`` runs each (case, T)
N times, each cold, and counts in how many the verdict and final model (the chosen trial's
flow and params, the answer model's sha256) are those of the first run, and how many runs the
most common outcome has (a first run that hit the limit early is one odd run, not four), and how
many runs hand the user the same model (the original when it is kept, whichever losing candidate a
run tried; else the answer model by its sha256). ``--render limits-<date>.json`` rewrites that
run's tables in this version's columns without running anything.

The table goes to stdout and ``bench/results/limits-<date>.md`` with the command and the
machine's load average at the start and end (other work on the machine slows the runs).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH / "zoo"))

from zoolib import CACHE, STAMP, built, link  # noqa: E402

DIGITS = REPO / "examples" / "digits"
TOLERANCE = 0.05  # issue 23: "ends within T (+5%)"


def zoo_models() -> list[str]:
    return sorted(p.parent.name for p in (BENCH / "zoo").glob("*/build.py"))


def case_files(name: str) -> tuple[Path, list[Path]]:
    """(the case's committed config, the files its config names relatively: linked into the run's folder)."""
    if name == "digits":
        return DIGITS / "config.yaml", [p for p in DIGITS.iterdir() if p.is_file() and p.suffix != ".yaml"]
    here, there = BENCH / "zoo" / name, CACHE / name
    if not built(name):
        raise SystemExit(
            f"--models: zoo model {name} is not built; run: python bench/zoo/run.py --build-only --models {name}"
        )
    data = [p for p in there.iterdir() if p.is_file() and not p.is_symlink() and p.name not in (STAMP, "zoo-run.yaml")]
    link(name, [p.name for p in data])  # the zoo's scripts may look for the data beside themselves
    scripts = [p for p in here.glob("*.py") if p.name != "build.py"]
    return here / "config.yaml", data + scripts


def prepare(name: str, timeout_s: float, max_trials: int, folder: Path) -> Path:
    """The case's config with the limits, in ``folder`` beside links to the files it names."""
    config_path, files = case_files(name)
    folder.mkdir(parents=True, exist_ok=True)
    for file in files:
        (folder / file.name).symlink_to(file.resolve() if file.parent == DIGITS else file)
    config = yaml.safe_load(config_path.read_text())
    stop = config.setdefault("stop", {})
    stop["timeout_s"] = timeout_s
    stop["max_trials"] = max_trials
    path = folder / "limits.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def child_env(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    if env.get("PYTHONPATH"):  # the run's working folder differs: relative entries would miss
        env["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    env.update(
        ORT_DISABLE_TELEMETRY="1",
        PYTHONUNBUFFERED="1",
        QUANTUNE_CACHE_DIR=str(cache),
        # the benches' own timing lock (bench/run.py): other benches' timings wait, tests' do not
        QUANTUNE_LATENCY_LOCK=str(CACHE / "bench-latency.lock"),
    )
    env.pop("QUANTUNE_REPORT", None)  # the report is part of what the limit must hold
    return env


def sha256(path: Path) -> str | None:
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def run_once(name: str, timeout_s: float, max_trials: int, keep: Path | None) -> dict[str, Any]:
    """One cold ``quantune run`` of the case under ``stop.timeout_s``; what it did."""
    with tempfile.TemporaryDirectory(prefix=f"limits-{name}-") as scratch:
        folder = Path(scratch)
        config = prepare(name, timeout_s, max_trials, folder / "case")
        output = folder / "out"
        command = [sys.executable, "-m", "quantune.cli", "run", str(config), "--output", str(output), "--restart"]
        start = time.perf_counter()
        done = subprocess.run(
            command,
            cwd=folder / "case",
            env=child_env(folder / "cache"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s * 3 + 300,
            check=False,
        )
        wall = time.perf_counter() - start
        row = summarize(name, timeout_s, wall, done.returncode, done.stdout, output)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            stem = f"{name}-{timeout_s:g}-{int(time.time())}"
            (keep / f"{stem}.log").write_text(done.stdout)
            if (output / "quantune.log").is_file():
                (keep / f"{stem}.quantune.log").write_text((output / "quantune.log").read_text(errors="replace"))
        return row


def summarize(name: str, timeout_s: float, wall: float, code: int, console: str, output: Path) -> dict[str, Any]:
    row: dict[str, Any] = {
        "case": name,
        "T": timeout_s,
        "wall_s": round(wall, 1),
        "ratio": round(wall / timeout_s, 3),
        "held": wall <= timeout_s * (1 + TOLERANCE),
        "exit": code,
        "report": (output / "report.html").is_file(),
        "time_line": time_line(console),
        "traceback": "Traceback (most recent call last)" in console,
    }
    path = output / "results.json"
    if not path.is_file():
        tail = console.strip().splitlines()[-1:] or [""]
        row.update(verdict=f"no results (exit {code})", stop_reason=tail[0][:160], trials=0)
        return row
    results = json.loads(path.read_text())
    replayed = set(results.get("replayed_trials") or [])
    trials = [t for t in results.get("trials") or [] if t.get("number") not in replayed]
    best = results.get("best") or {}
    confirmation = results.get("latency_confirmation") or {}
    verdict = results.get("verdict", "-")
    confirmed = best.get("number") in (confirmation.get("trials") or []) and confirmation.get("rounds", 0) >= 5
    kinds = ("best", "unconfirmed", "closest_miss")
    answer = next((output / kind / "model.onnx" for kind in kinds if (output / kind).is_dir()), None)
    row.update(
        trials=len(trials),
        verdict=verdict,
        improved_confirmed=(confirmed if verdict == "improved" else None),
        stop_reason=results.get("stop_reason", ""),
        chosen=best.get("number"),
        final={
            "verdict": verdict,
            "flow": best.get("flow"),
            "params": best.get("params"),
            "model": sha256(answer) if answer is not None else None,
        },
        time_spent_s=results.get("time_spent_s") or {},
    )
    return row


def time_line(console: str) -> str:
    """The console's ``time:`` line, whose wrapping (the console's width) is undone."""
    found = re.search(r"^time: (.*?\(total\s+[0-9.]+\s+s\))", console, flags=re.M | re.S)
    return "time: " + " ".join(found.group(1).split()) if found else ""


def load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def markdown(rows: list[dict[str, Any]], repeat: int) -> str:
    head = "| case | T (s) | wall (s) | wall/T | held (<= T+5%) | trials | verdict | improved confirmed | report.html | stop reason | time |"
    sep = "|" + "---|" * (head.count("|") - 1)
    lines = [head, sep]
    for row in rows:
        confirmed = {None: "-", True: "yes", False: "**no**"}[row.get("improved_confirmed")]
        lines.append(
            "| {case} | {T:g} | {wall_s} | {ratio:.2f} | {held} | {trials} | {verdict} | {confirmed} | {report} | {stop} | {time} |".format(
                case=row["case"],
                T=row["T"],
                wall_s=row["wall_s"],
                ratio=row["ratio"],
                held="yes" if row["held"] else "**no**",
                trials=row.get("trials", 0) if row.get("trials") else "**0**",
                verdict=row.get("verdict", "-"),
                confirmed=confirmed,
                report="yes" if row["report"] else "**no**",
                stop=_cell(row.get("stop_reason", "")),
                time=_cell(row.get("time_line", "").removeprefix("time: ")),
            )
        )
    if repeat > 1:
        lines += [
            "",
            "| case | T (s) | runs | same verdict and final model as run 1 | most runs alike (verdict and final model) "
            "| most runs alike (model handed back) | verdicts | chosen trials |",
            "|---|---|---|---|---|---|---|---|",
        ]
        groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
        for row in rows:
            groups.setdefault((row["case"], row["T"]), []).append(row)
        for (case, limit), group in groups.items():
            first = group[0].get("final")
            same = sum(1 for row in group if first is not None and row.get("final") == first)
            finals = [json.dumps(row.get("final"), sort_keys=True, default=str) for row in group]
            alike = max((finals.count(final) for final in finals if final != "null"), default=0)
            # what the user is handed: the original when it is kept (whichever losing candidate a run
            # tried last: "final" above names it), else the answer folder's model (best/, unconfirmed/,
            # closest_miss/) by its sha256
            handed = [
                "original" if row.get("verdict") == "keep_original" else (row.get("final") or {}).get("model")
                for row in group
            ]
            handed_alike = max((handed.count(model) for model in handed if model is not None), default=0)
            verdicts = ", ".join(str(row.get("verdict")) for row in group)
            chosen = ", ".join(str(row.get("chosen")) for row in group)
            lines.append(
                f"| {case} | {limit:g} | {len(group)} | {same} of {len(group)} | {alike} of {len(group)} "
                f"| {handed_alike} of {len(group)} | {verdicts} | {chosen} |"
            )
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return re.sub(r"\s+", " ", str(text)).replace("|", "\\|")[:220]


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help="comma-separated cases: zoo models and/or digits (default: all zoo + digits)")
    parser.add_argument("--timeouts", default="60,120,240", help="comma-separated stop.timeout_s values (s)")
    parser.add_argument("--repeat", type=int, default=1, help="cold runs per (case, T): reproducibility")
    parser.add_argument("--max-trials", type=int, default=200, help="stop.max_trials (large: the limit must stop it)")
    parser.add_argument("--out", type=Path, default=BENCH / "results", help="where the table goes")
    parser.add_argument("--logs", type=Path, help="keep each run's console output and quantune.log in this folder")
    parser.add_argument("--render", type=Path, help="rewrite the tables of an earlier limits-*.json's .md (no runs)")
    return parser.parse_args()


def render(path: Path) -> int:
    """Rewrites the tables of an earlier run's markdown from its json, keeping its heading (command,
    load): a table of this version's columns without running the cases again."""
    rows = json.loads(path.read_text())
    runs: dict[tuple[str, float], int] = {}
    for row in rows:
        runs[(row["case"], row["T"])] = runs.get((row["case"], row["T"]), 0) + 1
    markdown_path = path.with_suffix(".md")
    heading = markdown_path.read_text().split("\n| case |", 1)[0] if markdown_path.is_file() else ""
    markdown_path.write_text(heading + "\n" + markdown(rows, max(runs.values(), default=1)))
    print(f"rewrote {markdown_path}")
    return 0


def main() -> int:
    args = parse()
    if args.render is not None:
        return render(args.render)
    known = ["digits", *zoo_models()]
    cases = [m.strip() for m in (args.models or ",".join(known)).split(",") if m.strip()]
    unknown = [c for c in cases if c not in known]
    if unknown:
        print(f"--models: unknown case(s) {unknown}; known: {known}", file=sys.stderr)
        return 2
    try:
        timeouts = [float(t) for t in args.timeouts.split(",") if t.strip()]
    except ValueError:
        print(f"--timeouts: '{args.timeouts}' is not a comma-separated list of seconds", file=sys.stderr)
        return 2
    load_before, started = load(), dt.datetime.now(dt.timezone.utc)
    rows = []
    for limit in timeouts:
        for case in cases:
            for index in range(max(1, args.repeat)):
                row = run_once(case, limit, args.max_trials, args.logs)
                rows.append(row)
                print(
                    f"[limits {time.strftime('%H:%M:%S')}] {case} T={limit:g} #{index + 1}: {row['wall_s']} s "
                    f"({row['ratio']:.2f} T), {row.get('trials')} trials, {row.get('verdict')}; {row.get('time_line')}",
                    flush=True,
                )
    table = markdown(rows, args.repeat)
    command = "python bench/limits.py " + " ".join(sys.argv[1:])
    note = (
        f"# stop.timeout_s held? ({started:%Y-%m-%d %H:%M} UTC)\n\n`{command}`\n\n"
        f"Cold quantune cache per run, max_trials {args.max_trials}; wall = process start to exit. "
        f"Machine: {os.cpu_count()} CPUs, load average {load_before} at the start, {load()} at the end "
        "(shared with other work).\n\n"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"limits-{started:%Y-%m-%d-%H%M}.md"
    path.write_text(note + table)
    (path.with_suffix(".json")).write_text(json.dumps(rows, indent=2, default=str) + "\n")
    print(table)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
