"""Kinds for bench/fault_kinds.py about a run's end and its evaluation's resolution: an undecided
side-by-side timing, an evaluation too small for its budget, a signal during the re-timing or
while report.html is drawn.

A signal "during" a stage is sent by the run to itself when it enters that stage's function (a
``sitecustomize`` on the run's PYTHONPATH wraps it): the same stage every time, whatever the
machine's speed, and the signal reaches the command as a user's Ctrl-C or a service manager's
SIGTERM would.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fault_kinds_list import RUN, Kind, cfg, data

ROOT = Path(__file__).resolve().parent.parent

HOOK = """
import os, signal
import {module} as where
real = where.{name}
def signalled(*args, **kwargs):
    os.kill(os.getpid(), signal.{signal})
    return real(*args, **kwargs)
where.{name} = signalled
"""


def signal_in(module: str, name: str, signal: str, **env: str):
    """A run that sends itself ``signal`` (SIGINT, SIGTERM) on entering ``module.name``."""

    def setup(p: Any) -> list[str]:
        p.write("hooks/sitecustomize.py", HOOK.format(module=module, name=name, signal=signal))
        p.set("evaluation.latency.confirm_top", 1)
        p.env.update(PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{p.folder / 'hooks'}", **env)
        p.save_config()
        return RUN

    return setup


def _results(p: Any) -> dict[str, Any]:
    return json.loads((p.folder / "out" / "results.json").read_text())


def _interrupted_unconfirmed(p: Any, done: Any) -> str | None:
    results = _results(p)
    if not results["stop_reason"].startswith("interrupted (Ctrl-C)"):
        return f"stop_reason: {results['stop_reason'][:80]}"
    if results["verdict"] not in ("unconfirmed", "keep_original") or "interrupted" not in results["verdict_reason"]:
        return f"verdict {results['verdict']}: {results['verdict_reason'][:80]}"
    return None


def _results_without_page(p: Any, done: Any) -> str | None:
    if not (p.folder / "out" / "results.json").is_file():
        return "no results.json"
    if (p.folder / "out" / "report.html").exists():
        return "report.html written although the drawing was stopped"
    return None


def _not_self_contradicting(p: Any, done: Any) -> str | None:
    """keep_original only where the side-by-side median ratio shows no gain beyond 2%."""
    results = _results(p)
    confirmation, best = results.get("latency_confirmation"), results.get("best") or {}
    if results["verdict"] != "keep_original" or not confirmation or "number" not in best:
        return None
    ratio = confirmation["ratios"].get(str(best["number"]))
    if ratio and ratio["ratio_median"] < 0.98:
        return f"keep_original quoting a median ratio of {ratio['ratio_median']:.3f}"
    return None


END_KINDS = [
    Kind(
        "end",
        "stop.timeout_s: 0 (stop at the first candidate, a short re-timing)",
        cfg(("stop.timeout_s", 0), ("evaluation.latency.confirm_top", 2)),
        (0,),
        after=_not_self_contradicting,
    ),
    Kind(
        "end",
        "Ctrl-C during the side-by-side re-timing",
        signal_in("quantune.engine.run.ending", "confirm_latency", "SIGINT"),
        (130,),
        after=_interrupted_unconfirmed,
    ),
    Kind(
        "end",
        "SIGTERM while report.html is drawn",
        signal_in("quantune.report.html", "render_html", "SIGTERM", QUANTUNE_REPORT="1"),
        (143,),
        names=("quantune report",),
        after=_results_without_page,
    ),
    Kind(
        "data",
        "evaluation of one row (a 1% budget is a hundredth of a row)",
        data("one.npz", lambda arrays: {key: value[:1] for key, value in arrays.items()}),
        (0,),
        names=("finer than one row",),
    ),
]
