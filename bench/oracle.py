"""The oracle: each fallback unit's real effect on the metric, and how well sensitivity ranks them.

    python bench/oracle.py MODEL CONFIG [--out bench/results] [--name NAME] [--max-units N]
                           [--by-compute] [--fp32-top N]

For every fallback unit quantune's accuracy strategies can move (its groups, a decode head's
Concat included: ``AccuracyContext.candidates``), two models are built and evaluated on the
config's own metric, through quantune's own passes, cache and evaluator (a strategy, ``oracle``,
proposes them to the engine exactly as the fallback stages do, by ``nodes_to_exclude``):

* **alone int8**: this unit quantized, every other unit in fp32 -- the loss it causes by itself;
* **alone fp32**: this unit in fp32, every other unit quantized -- what keeping it float buys.

Plus the fully quantized model. The truth table (``oracle-<name>-<date>.md`` + ``.json``) then
scores the rankings quantune uses against the truth (the loss alone int8): the sensitivity
ranking (``ctx.ranked``) and the bisection's order (sensitivity per share of the original's time):
Spearman's rank correlation, and whether the worst unit is in the first 1 / 3 / 5. It also says
whether a single unit in fp32 gives an in-budget model faster than the original (an oracle over
single fallbacks, not every subset). The quant step's parameters are its defaults (and the
config's fixed values), in the config's first flow that quantizes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import quantune
from quantune.config import load_config
from quantune.strategy.accuracy.common import AccuracyStrategy
from quantune.strategy.accuracy.speed import priced
from quantune.strategy.options import AccuracyOptions
from quantune.strategy.registry import register_strategy

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle_report import markdown  # noqa: E402  (beside this script)

FULL = "oracle: all int8"
SEARCH = "oracle search:"
TOP = (1, 3, 5)


@register_strategy("oracle")
class OracleStrategy(AccuracyStrategy):
    """Proposes the fully quantized model, then each unit alone int8 and alone fp32."""

    name = "oracle"
    Options = AccuracyOptions
    # only the units worst alone int8 are also tried alone fp32 (None: every unit; the head's
    # units always): bounds a run on a model with many units (``--fp32-top``)
    fp32_top: int | None = None

    # a compute group and the non-compute groups after it form one unit, tried together (False:
    # every group alone): bounds a model with hundreds of groups (``--by-compute``)
    by_compute: bool = False

    def stages(self):
        base = self.ctx.base_point()
        groups = list(self.ctx.candidates)
        yield from self.try_point(base, FULL)
        ranked = self.ctx.ranked(base, groups)
        costs = dict(self.problem.node_costs()) if self.problem.node_costs is not None else {}
        units = blocks(groups, self.by_compute)
        self.orders = {
            "sensitivity": block_order([[g.name, score] for g, score in ranked], units),
            "bisect": block_order([[g.name, score] for g, score in priced(ranked, costs)], units),
        }
        self.units = [{"name": u.name, "op_type": u.op_type, "nodes": list(u.nodes)} for u in units]
        alone: dict[str, Any] = {}
        for unit in units:
            others = [g for u in units if u is not unit for g in u.members]
            alone[unit.name] = yield from self.try_point(self.fallback(base, others), f"oracle: {unit.name} alone int8")
        truth = sorted(units, key=lambda g: self.harm(alone[g.name]), reverse=True)
        head = set(getattr(self.ctx, "head", ())) | set(getattr(self.ctx, "lead_in", ()))
        floats = truth if self.fp32_top is None else truth[: self.fp32_top]
        floats += [g for g in units if head & set(g.nodes) and g not in floats]  # the head's and lead-in's too
        for unit in floats:
            yield from self.try_point(self.fallback(base, unit.members), f"oracle: {unit.name} alone fp32")
        # the oracle search: the truth's worst 1, 2, 4, ... units in fp32, until one meets the budget
        count = 1
        while count <= len(truth):
            worst = [g for u in truth[:count] for g in u.members]
            outcome = yield from self.try_point(self.fallback(base, worst), f"{SEARCH} {count} worst in fp32")
            if outcome.meets:
                break
            count *= 2

    def harm(self, outcome) -> tuple[float, float]:
        """How much a unit alone int8 breaks the model: its budget violation, then how far its
        metric moved from the original's (a failed trial counts worst)."""
        if outcome.failed:
            return (float("inf"), float("inf"))
        moved = [
            abs(v - self.baseline[k]) for k, v in outcome.metrics.items() if k in self.baseline and k != "latency_ms"
        ]
        return (outcome.violation, max(moved, default=0.0))

    def learned(self) -> dict[str, Any]:
        return {
            **super().learned(),
            "orders": getattr(self, "orders", {}),
            "units": getattr(self, "units", []),
            "head": sorted(getattr(self.ctx, "head", ())),  # (main before the head existed: none)
            "lead_in": sorted(getattr(self.ctx, "lead_in", ())),
        }


@dataclass(frozen=True)
class Unit:
    """What the oracle tries alone: one fallback group, or a block of them (``--by-compute``)."""

    name: str
    op_type: str
    nodes: tuple[str, ...]
    members: tuple[Any, ...]


COMPUTE = {"Conv", "ConvTranspose", "MatMul", "Gemm", "Attention", "LSTM", "GRU", "RNN"}


def blocks(groups: list[Any], by_compute: bool) -> list[Unit]:
    """The groups as units: each alone, or (``by_compute``) each compute group (a Conv, a MatMul)
    with the non-compute groups after it in graph order (its activation, a Split, the decode
    head's arithmetic) up to the next compute group; ones before the first stand alone."""
    chunks: list[list[Any]] = []
    for group in groups:
        if not by_compute or group.op_type in COMPUTE or not chunks:
            chunks.append([group])
        else:
            chunks[-1].append(group)
    out = []
    for members in chunks:
        first = members[0]
        name = first.name if len(members) == 1 else f"{first.name} +{len(members) - 1}"
        types = "+".join(dict.fromkeys(g.op_type for g in members))
        out.append(Unit(name, types, tuple(n for g in members for n in g.nodes), tuple(members)))
    return out


def block_order(order: list[list[Any]], units: list[Unit]) -> list[list[Any]]:
    """A group ranking as a unit ranking: each unit at its best member's place, with its score."""
    owner = {g.name: u.name for u in units for g in u.members}
    seen: dict[str, float] = {}
    for name, score in order:
        unit = owner.get(name)
        if unit is not None and unit not in seen:
            seen[unit] = score
    return [[name, score] for name, score in seen.items()]


def ranks(values: list[float]) -> np.ndarray:
    """Average ranks (ties share their mean rank), 1 = smallest."""
    array = np.asarray(values, dtype=float)
    order = array.argsort(kind="stable")
    out = np.empty(len(array))
    out[order] = np.arange(1, len(array) + 1)
    for value in np.unique(array):
        same = array == value
        out[same] = out[same].mean()
    return out


def spearman(truth: list[float], predicted: list[float]) -> float | None:
    """Spearman's rho (None when either side is constant: no ranking to compare)."""
    if len(truth) < 2:
        return None
    a, b = ranks(truth), ranks(predicted)
    if a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def score_order(order: list[list[Any]], truth: dict[str, float]) -> dict[str, Any]:
    """A ranking (most sensitive first) against the truth (loss alone int8, higher = worse)."""
    names = [name for name, _ in order if name in truth]
    worst = max(truth.values()) if truth else 0.0
    # no unit loses anything alone: there is no culprit to find, and nothing to score
    # (nor when every unit loses the same alone: what breaks the model is outside the units)
    alike = len(set(truth.values())) <= 1
    culprits = {name for name, loss in truth.items() if loss == worst} if worst > 0 and not alike else set()
    position = {name: index for index, name in enumerate(names)}
    first = min((position[name] for name in culprits if name in position), default=None)
    scores = {name: float(score) for name, score in order}
    return {
        "spearman": spearman([truth[n] for n in names], [scores[n] for n in names]),
        "worst_units": sorted(culprits),
        "worst_rank": None if first is None else first + 1,
        **{f"worst_in_top_{k}": None if first is None else first < k for k in TOP},
        "order": names,
    }


def run(model: Path, config: Path, out: Path, name: str, max_units: int | None) -> dict[str, Any]:
    """The oracle's quantune run (the config's own data, metric and passes; its relative paths
    stay relative to its file) and the truth table read from it."""
    loaded = load_config(config)
    options = loaded.config.search.strategy_options or {}
    overrides = {
        "model": str(model.resolve()),
        "search.strategy": "oracle",
        "search.strategy_options": {k: v for k, v in options.items() if k in AccuracyOptions.model_fields},
        "stop": {"max_trials": 100_000},
        "executor": {"kind": "inline"},  # the oracle strategy is registered in this process
        "evaluation.latency.confirm_top": 0,
    }
    result = quantune.tune(config, output=out / f"oracle-{name}", restart=True, overrides=overrides)
    table = truth_table(result, max_units)
    table.update({"model": str(model), "config": str(config), "metric": result.metric})
    table["retimed"] = retimed(result, config)
    return table


def retimed(result, config: Path, most: int = 3) -> list[dict[str, Any]]:
    """The verdict's models re-timed side by side with the original (``zoo_report.retime``:
    interleaved, 30 rounds, one thread): search-time figures on a loaded machine put models
    with one conv int8 at 1.7x. Only mostly-int8 models are verdict candidates (the fully int8
    one, "alone fp32", the oracle search), never "alone int8" (a float model with one unit
    quantized): up to ``most`` that meet the budget, fastest first, else the most accurate."""
    sys.path.insert(0, str(REPO / "bench" / "zoo"))
    from zoo_report import retime

    pool = [
        t
        for t in result.trials
        if t.accuracy_loss is not None and "alone int8" not in t.stage and t.model_path and Path(t.model_path).is_file()
    ]
    meeting = sorted((t for t in pool if t.meets_criterion), key=lambda t: t.metrics.get("latency_ms") or 0.0)
    chosen = meeting[:most] or sorted(pool, key=lambda t: t.accuracy_loss)[:1]
    out = []
    for trial in chosen:
        figures = retime(config, Path(trial.model_path))
        out.append({"stage": trial.stage, "loss": trial.accuracy_loss, "meets": bool(trial.meets_criterion), **figures})
    return out


def truth_table(result, max_units: int | None) -> dict[str, Any]:
    notes = result.strategy_notes
    head = set(notes.get("head", []))
    lead_in = set(notes.get("lead_in", []))
    base_ms = result.baseline.get("latency_ms") or 0.0
    by_stage = {t.stage.split(" (duplicate")[0]: t for t in result.trials}
    rows = []
    for unit in notes.get("units", [])[:max_units]:
        alone_int8 = by_stage.get(f"oracle: {unit['name']} alone int8")
        alone_fp32 = by_stage.get(f"oracle: {unit['name']} alone fp32")
        rows.append(
            {
                "unit": unit["name"],
                "op_type": unit["op_type"],
                "nodes": len(unit["nodes"]),
                "head": bool(head & set(unit["nodes"])),
                "lead_in": bool(lead_in & set(unit["nodes"])),
                "loss_alone_int8": None if alone_int8 is None else alone_int8.accuracy_loss,
                "loss_alone_fp32": None if alone_fp32 is None else alone_fp32.accuracy_loss,
                "meets_alone_fp32": None if alone_fp32 is None else bool(alone_fp32.meets_criterion),
                "speed_alone_fp32": _speed(alone_fp32, base_ms),
            }
        )
    full = by_stage.get(FULL)
    truth = {r["unit"]: r["loss_alone_int8"] for r in rows if r["loss_alone_int8"] is not None}
    orders = notes.get("orders", {})
    faster = [
        r for r in rows if r["meets_alone_fp32"] and r["speed_alone_fp32"] is not None and r["speed_alone_fp32"] > 1.0
    ]
    return {
        "criterion": result.criterion.describe(),
        "original": {result.metric: result.baseline.get(result.metric), "latency_ms": base_ms},
        "full_int8": None
        if full is None
        else {"loss": full.accuracy_loss, "meets": bool(full.meets_criterion), "speed": _speed(full, base_ms)},
        "units": rows,
        "rankings": {kind: score_order(order, truth) for kind, order in orders.items()},
        "single_fallback_in_budget_and_faster": [r["unit"] for r in faster],
        "evaluations": len(result.trials),
        "search": [
            {"stage": t.stage, "loss": t.accuracy_loss, "meets": bool(t.meets_criterion), "speed": _speed(t, base_ms)}
            for t in result.trials
            if t.stage.startswith(SEARCH)
        ],
        **best_of(result.trials, base_ms),
    }


def best_of(trials, base_ms: float) -> dict[str, Any]:
    """Over the mostly-int8 models the oracle built (not "alone int8": see :func:`retimed`;
    search-time timings): the fastest one that meets the budget and is faster than the
    original, and the most accurate one faster than the original."""
    faster = [
        t
        for t in trials
        if t.accuracy_loss is not None and "alone int8" not in t.stage and (_speed(t, base_ms) or 0.0) > 1.0
    ]
    meeting = [t for t in faster if t.meets_criterion]
    pick = lambda t: {"stage": t.stage, "loss": t.accuracy_loss, "speed": _speed(t, base_ms)}  # noqa: E731
    fastest = max(meeting, key=lambda t: _speed(t, base_ms) or 0.0, default=None)
    accurate = min(faster, key=lambda t: (t.accuracy_loss, -(_speed(t, base_ms) or 0.0)), default=None)
    return {
        "in_budget_faster": None if fastest is None else pick(fastest),
        "most_accurate_faster": None if accurate is None else pick(accurate),
    }


def _speed(trial, base_ms: float) -> float | None:
    latency = None if trial is None else trial.metrics.get("latency_ms")
    return base_ms / latency if latency and base_ms else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("config", type=Path)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--runs", type=Path, default=Path("runs"), help="where the oracle's quantune runs go")
    parser.add_argument("--name", default=None, help="the tables' name (default: the config folder's)")
    parser.add_argument("--max-units", type=int, default=None)
    parser.add_argument("--by-compute", action="store_true", help="a unit: a compute group and the groups after it")
    parser.add_argument(
        "--fp32-top", type=int, default=None, help="try alone fp32 only the N worst units (and the head's)"
    )
    args = parser.parse_args(argv)
    OracleStrategy.fp32_top = args.fp32_top
    OracleStrategy.by_compute = args.by_compute
    for path, what in ((args.model, "MODEL"), (args.config, "CONFIG")):
        if not path.is_file():
            print(f"{what}: no file {path}", file=sys.stderr)
            return 2
    name = args.name or args.config.resolve().parent.name
    table = run(args.model, args.config, args.runs, name, args.max_units)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d-%H%M")
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python bench/oracle.py " + " ".join(sys.argv[1:] if argv is None else argv)
    (args.out / f"oracle-{name}-{stamp}.json").write_text(json.dumps({**table, "command": command}, indent=2) + "\n")
    text = markdown(table, command)
    (args.out / f"oracle-{name}-{stamp}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
