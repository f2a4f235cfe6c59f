"""Fallback units per zoo model and flow, and the bound on evaluations to the first model in budget.

    python bench/zoo/units.py [--models a,b] [--report bench/results/peers-<date>.json]

A *fallback unit* is one group the ``quantune`` strategy may keep in float (its context's
candidates). The goal of the search: the first quantized model within the budget after at
most ``ceil(log2 units) + 3`` full evaluations. With ``--report`` (a peer bench run), each
model's quantune row (evaluations to its first quantized model in budget) is set beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ZOO = Path(__file__).resolve().parent
sys.path.insert(0, str(ZOO))

from zoolib import CACHE  # noqa: E402


def units(name: str) -> dict[str, int]:
    """Flow name -> the quantune strategy's fallback units for the model's zoo config."""
    from quantune.config import load_config
    from quantune.engine.run.problem import search_problem
    from quantune.engine.trials.setup import build_run
    from quantune.strategy.accuracy.context import AccuracyContext

    loaded = load_config(CACHE / name / "zoo-run.yaml")
    problem = search_problem(build_run(loaded), loaded.config)
    return {ctx.flow_name: len(ctx.candidates) for ctx in AccuracyContext.all_from_problem(problem, "quantune")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="captcha_ddddocr,minilm_l3,ppocrv6_rec,ppocr_cls,lac_tagger,dfn_enc")
    parser.add_argument("--report", type=Path, help="a bench/run.py report (JSON) with quantune rows")
    args = parser.parse_args()
    rows = {}
    if args.report:
        for entry in json.loads(args.report.read_text())["cases"]:
            rows[entry["case"]] = next((r for r in entry["rows"] if r["tool"] == "quantune"), {})
    print("| model | fallback units (static / dynamic) | bound ceil(log2 n)+3 | evaluations to first in budget |")
    print("| --- | --- | --- | --- |")
    for name in [m for m in args.models.split(",") if m]:
        found = units(name)
        static = found.get("static_quant", 0)
        bound = math.ceil(math.log2(max(static, 2))) + 3
        first = rows.get(name, {}).get("first_feasible_evaluations")
        per_flow = " / ".join(str(found.get(flow, "-")) for flow in ("static_quant", "dynamic_quant"))
        print(f"| {name} | {per_flow} | {bound} | {'-' if first is None else first} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
