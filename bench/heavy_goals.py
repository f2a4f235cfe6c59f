"""Issue 41's goals on the heavy zoo models, read from a bench run beside Neural Compressor.

    python bench/heavy_goals.py bench/results/heavy-<date>.json [...] [--checks DIR] [--out FILE]

Every figure is counted in evaluations of the original (E): the seconds quantune's own run took
to evaluate the original model (its cache's ``evals`` entry, ``evaluation_s``: the data through
the model and the metric, the run's conditions), so a goal reads the same on a fast or a loaded
machine. Per case of each report (``bench/run.py``'s JSON; quantune's work folder beside it under
``$QUANTUNE_BENCH_CACHE/runs/<report name>/<case>/quantune``):

- the whole run (the harness's clock, process start to exit) in E, against 12 E when the answer
  is a fallback (the chosen trial keeps nodes in float) and 4 E when plain int8 holds;
- beside each Neural Compressor row: its whole run, its first model in budget, its answer (the
  side-by-side latency ratio to fp32); quantune's run must not be longer than a row that reached
  the same or a worse answer, and its first model in budget must come first;
- the sensitivity stage (``time_spent_s``) in E (goal 2.5) and each bisection trial (trials whose
  stage is ``bisect``, ``durations.total_s``) in E (goal 1.3);
- peak memory: each stage's (``stage_peak_rss_mb``) and the largest trial's, against the budget
  (a quarter of the machine's memory: ``quantune.memory.memory_budget_mb``);
- with ``--checks DIR``: ``DIR/check-<case>.log``, ``quantune check`` piped through ``cat`` with
  each line stamped (``start T``, ``T line``..., ``end T``): its time (goal 60 s) and the largest
  gap between two lines (goal 30 s).
"""

from __future__ import annotations

import argparse
import json
import re
from itertools import pairwise
from pathlib import Path

from cases import CACHE

GOALS = {"fallback": 12.0, "plain": 4.0, "sensitivity": 2.5, "bisect": 1.3, "check_s": 60.0, "gap_s": 30.0}


def original_evaluation_s(cache: Path) -> float:
    for path in sorted((cache / "evals").glob("*.json")):
        value = json.loads(path.read_text()).get("value", {})
        if "evaluation_s" in value and "timing_s" in value:
            return float(value["evaluation_s"])
    raise SystemExit(f"{cache}: no evaluation of the original in its evals")


def fallback(results: dict) -> bool | None:
    chosen = results.get("best") or results.get("closest_miss")
    if not chosen:
        return None
    return any("exclude" in key and value for key, value in (chosen.get("params") or {}).items())


def check_figures(log: Path) -> tuple[float, float]:
    stamps = []
    for line in log.read_text().splitlines():
        head = line.split(" ", 2)
        stamp = head[1] if head[0] in ("start", "end") else head[0]
        if re.fullmatch(r"\d+\.\d+", stamp):
            stamps.append(float(stamp))
    return stamps[-1] - stamps[0], max(b - a for a, b in pairwise(stamps))


def verdict(value: float, goal: float) -> str:
    return (
        f"met ({value:.2f} <= {goal:g})"
        if value <= goal
        else f"**missed** ({value:.2f} > {goal:g}, x{value / goal:.2f})"
    )


def case_lines(report: Path, case: dict, checks: Path | None) -> list[str]:
    import quantune.memory

    name, rows = case["case"], {row["tool"]: row for row in case["rows"]}
    work = CACHE / "runs" / report.stem / name / "quantune"
    if not (work / "run" / "results.json").is_file():
        stops = "; ".join(f"{tool}: {row.get('status')}" for tool, row in rows.items() if tool != "fp32")
        return [f"### {name}", "", f"quantune's row left no results.json ({stops}).", ""]
    results = json.loads((work / "run" / "results.json").read_text())
    e = original_evaluation_s(work / "cache")
    q, fp32 = rows["quantune"], rows["fp32"]["latency_ms"]
    kind = fallback(results)
    answer = "fallback" if kind else "plain int8" if kind is not None else "none"
    if not results.get("best"):
        answer = f"none in budget (closest miss: {answer})"
    whole = q["process_s"] / e
    lines = [
        f"### {name}",
        "",
        f"One evaluation of the original (E): **{e:.1f} s** (quantune's run). quantune: verdict "
        f"`{results['verdict']}`, answer {answer}, {q['latency_ms'] / fp32:.2f}x fp32 latency side by side, "
        f"in budget: {q.get('meets')}; stop: {results['stop_reason'][:160]}",
        "",
        "| goal | figure | status |",
        "| --- | --- | --- |",
    ]
    goal = GOALS["fallback" if kind else "plain"]
    lines.append(
        f"| whole run <= {goal:g} E ({answer}) | {q['process_s']:.0f} s = {whole:.2f} E, "
        f"{len(results['trials'])} trial(s) | {verdict(whole, goal) if results.get('best') else 'n/a: no answer'} |"
    )
    for tool, row in rows.items():
        if not tool.startswith("inc"):
            continue
        ratio = row["latency_ms"] / fp32 if row.get("latency_ms") else None
        worse = not row.get("meets") or ratio is None or ratio >= q["latency_ms"] / fp32
        shown = f"{ratio:.2f}x" if ratio else "-"
        longer = q["process_s"] <= row["process_s"] if worse else None
        status = "met" if longer else "**missed**" if longer is False else "n/a (NC's answer is better)"
        if not row.get("model"):  # a worse answer, but say which: a crash reads differently from a miss
            status += f" (NC made no model: {row.get('stop') or row.get('status')})"
        lines.append(
            f"| not longer than {tool} (answer {shown}, in budget: {row.get('meets')}) | quantune {q['process_s']:.0f} s "
            f"vs {row['process_s']:.0f} s | {status} |"
        )
        first, theirs = q.get("first_feasible_s"), row.get("first_feasible_s")
        met = first is not None and (theirs is None or first <= theirs)
        shown_first = f"{first:.0f} s" if first is not None else "none"
        status = "met" if met else "n/a (neither found one)" if first is None and theirs is None else "**missed**"
        lines.append(
            f"| first in budget before {tool} | quantune {shown_first} vs {f'{theirs:.0f} s' if theirs else 'none'} "
            f"| {status} |"
        )
    spent = results.get("time_spent_s") or {}
    sensitivity = sum(v for k, v in spent.items() if k.startswith("sensitivity"))
    lines.append(
        f"| sensitivity <= 2.5 E | {sensitivity:.1f} s = {sensitivity / e:.2f} E "
        f"| {verdict(sensitivity / e, GOALS['sensitivity']) if sensitivity else 'did not run'} |"
    )
    bisects = [t["durations"]["total_s"] for t in results["trials"] if (t.get("stage") or "").startswith("bisect")]
    if bisects:
        worst = max(bisects) / e
        figure = f"{len(bisects)} trials, {min(bisects):.0f}-{max(bisects):.0f} s = up to {worst:.2f} E"
        lines.append(f"| a bisection trial <= 1.3 E | {figure} | {verdict(worst, GOALS['bisect'])} |")
    else:
        lines.append("| a bisection trial <= 1.3 E | no bisection trial ran | n/a |")
    budget = quantune.memory.memory_budget_mb()
    peaks = dict(results.get("stage_peak_rss_mb") or {})
    trial_peaks = [t["peak_rss_mb"] for t in results["trials"] if t.get("peak_rss_mb")]
    if trial_peaks:
        peaks["trials (largest)"] = max(trial_peaks)
    shown = ", ".join(f"{k} {v:.0f} MB" for k, v in peaks.items())
    over = [k for k, v in peaks.items() if v > budget]
    lines.append(
        f"| peak memory of every stage <= budget ({budget:.0f} MB) | {shown} | {'met' if not over else '**missed**: ' + ', '.join(over)} |"
    )
    log = checks / f"check-{name}.log" if checks else None
    if log and log.is_file():
        took, gap = check_figures(log)
        lines.append(f"| `quantune check` <= 60 s | {took:.0f} s | {verdict(took, GOALS['check_s'])} |")
        lines.append(
            f"| progress lines at least every 30 s (check, piped) | largest gap {gap:.1f} s | {verdict(gap, GOALS['gap_s'])} |"
        )
    spent_line = ", ".join(f"{k} {v:.0f} s" for k, v in spent.items() if v >= 0.5)
    return [*lines, "", f"quantune's time by phase: {spent_line}", ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--checks", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    lines = []
    for report in args.reports:
        data = json.loads(report.read_text())
        for case in data["cases"]:
            lines += case_lines(report, case, args.checks)
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
