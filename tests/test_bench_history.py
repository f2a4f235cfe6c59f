"""bench/history.py keeps the latest report of each benchmark and moves the others, intact, into
one JSON-lines file per family."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import history  # noqa: E402


def report(folder: Path, stem: str, figure: float, plot: bool = False) -> None:
    (folder / f"{stem}.json").write_text(json.dumps({"figure": figure}))
    (folder / f"{stem}.md").write_text(f"# {stem}\n\n| figure |\n| {figure} |\n")
    if plot:
        (folder / f"{stem}.png").write_bytes(b"\x89PNG")


def test_the_latest_stays_and_the_older_runs_become_history_lines(tmp_path):
    results, past = tmp_path / "results", tmp_path / "history"
    results.mkdir()
    report(results, "peers-2026-01-02-0900", 2.0, plot=True)
    report(results, "peers-2026-01-01-1200", 1.0, plot=True)
    report(results, "peers-2026-01-03-0800", 3.0, plot=True)
    report(results, "memory-2026-01-01", 7.0)
    report(results, "dev4-2026-01-02-1000", 4.0)
    (results / "README.md").write_text("the index")
    (results / "report-improved.png").write_bytes(b"\x89PNG")

    moved = history.rotate(results, past)

    assert sorted(moved) == ["dev4-2026-01-02-1000", "peers-2026-01-01-1200", "peers-2026-01-02-0900"]
    left = sorted(p.name for p in results.iterdir())
    assert left == [
        "README.md",
        "memory-2026-01-01.json",
        "memory-2026-01-01.md",
        "peers-2026-01-03-0800.json",
        "peers-2026-01-03-0800.md",
        "peers-2026-01-03-0800.png",
        "report-improved.png",
    ]
    lines = [json.loads(line) for line in (past / "peers.jsonl").read_text().splitlines()]
    assert [(r["file"], r["date"], r["json"]["figure"]) for r in lines] == [
        ("peers-2026-01-01-1200", "2026-01-01 12:00", 1.0),
        ("peers-2026-01-02-0900", "2026-01-02 09:00", 2.0),
    ]
    assert "| 1.0 |" in lines[0]["md"]
    assert [json.loads(line)["file"] for line in (past / "dev.jsonl").read_text().splitlines()] == [
        "dev4-2026-01-02-1000"
    ]

    report(results, "peers-2026-01-04-0700", 4.0)
    assert history.rotate(results, past) == ["peers-2026-01-03-0800"]  # appended, never rewritten
    assert len((past / "peers.jsonl").read_text().splitlines()) == 3
    assert history.rotate(results, past) == []
