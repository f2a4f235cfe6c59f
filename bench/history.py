"""Keeps bench/results/ to the latest table of each benchmark; moves the rest into bench/history/.

    python bench/history.py            # rotate: older runs appended to bench/history/<family>.jsonl
    python bench/history.py --dry-run  # say what would move

A benchmark's report is ``<name>-<YYYY-MM-DD>[-HHMM][-suffix].{md,json,png}`` (bench/run.py,
bench/zoo/run.py, bench/limits.py, ... write them). The newest report of each name stays in
bench/results/ (its md, json and plot); every older one becomes one line of
``bench/history/<family>.jsonl`` -- ``{"file", "date", "json", "md"}``: the report's name, its
date, the json's content (or null) and the markdown table's text (or null) -- and its files are
deleted. Plots are not kept for older runs: they are drawn from the json. Runs of development
names (``dev3``, ``review``, ...) keep no latest: all of them go to history. Lines are only
ever appended, so the history of a family is every run it had, oldest first.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
HISTORY = BENCH / "history"

REPORT = re.compile(r"^(?P<name>.*?)-?(?P<date>\d{4}-\d{2}-\d{2})(?:-(?P<time>\d{4}))?(?P<suffix>-[a-z][\w-]*)?$")
# development and one-off runs: history only, no "latest" kept in the tree
DEVELOPMENT = re.compile(
    r"^(dev\d+|review|peers-harness-check|issue25-zoo|providers-axis-rerun|quantune|bench|startup-digits"
    r"|zoo-detectors|zoo-layout-ppocrv6det|zoo-layout_cdla-init-limits|zoo-nudenet-.*"
    r"|oracle-decode_head-on-main|oracle-zoo-basic_pitch-local-noise|import-graph|import-graph-report2)$"
)
# reports the docs cite beside the latest of their benchmark (another configuration of it)
ALSO_KEPT = {"limits-2026-11-28-1140"}


def family(name: str) -> str:
    """The history file a benchmark name's runs go to."""
    if re.fullmatch(r"dev\d+", name):
        return "dev"
    for prefix in ("oracle", "import-graph", "providers-axis", "zoo", "startup"):
        if name == prefix or name.startswith(prefix + "-"):
            return prefix
    return {"review": "bench", "quantune": "bench", "peers-harness-check": "peers", "issue25-zoo": "zoo"}.get(
        name, name
    )


def reports(folder: Path) -> dict[str, dict[str, list[Path]]]:
    """Benchmark name -> report stem -> its files, for every dated report in ``folder``."""
    found: dict[str, dict[str, list[Path]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(folder.iterdir()):
        match = REPORT.match(path.stem) if path.suffix in (".md", ".json", ".png") else None
        if match:
            name = (match["name"] or "bench") + (match["suffix"] or "")
            found[name][path.stem].append(path)
    return found


def stamp(stem: str) -> str:
    match = REPORT.match(stem)
    assert match is not None
    return f"{match['date']} {match['time'][:2]}:{match['time'][2:]}" if match["time"] else match["date"]


def history_line(stem: str, files: list[Path]) -> dict[str, object]:
    by_suffix = {path.suffix: path for path in files}
    data = json.loads(by_suffix[".json"].read_text()) if ".json" in by_suffix else None
    text = by_suffix[".md"].read_text() if ".md" in by_suffix else None
    return {"file": stem, "date": stamp(stem), "json": data, "md": text}


def rotate(results: Path, history: Path, dry_run: bool = False) -> list[str]:
    """Moves every report but the latest of each benchmark into ``history``; returns what moved."""
    moved: list[str] = []
    lines: dict[str, list[dict[str, object]]] = defaultdict(list)
    for name, runs in reports(results).items():
        ordered = sorted(runs, key=stamp)
        keep = set() if DEVELOPMENT.match(name) else {ordered[-1]}
        for stem in ordered:
            if stem in keep or stem in ALSO_KEPT:
                continue
            if any(p.suffix in (".md", ".json") for p in runs[stem]):
                lines[family(name)].append(history_line(stem, runs[stem]))
            moved.append(stem)
            if not dry_run:
                for path in runs[stem]:
                    path.unlink()
    if not dry_run:
        history.mkdir(exist_ok=True)
        for name, rows in lines.items():
            with (history / f"{name}.jsonl").open("a") as out:
                for row in sorted(rows, key=lambda r: str(r["date"])):
                    out.write(json.dumps(row, separators=(",", ":"), default=str) + "\n")
    return moved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="say what would move, change nothing")
    args = parser.parse_args()
    moved = rotate(RESULTS, HISTORY, args.dry_run)
    verb = "would move" if args.dry_run else "moved"
    print(f"{verb} {len(moved)} report(s) to {HISTORY.relative_to(BENCH.parent)}/")


if __name__ == "__main__":
    main()
