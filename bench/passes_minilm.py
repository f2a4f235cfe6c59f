"""MiniLM-L3, 1% budget: fp32, fused, quantune with and without the new passes, and the peers' best, side by side.

    python bench/passes_minilm.py [--rows ROW,...] [--reuse RUN_DIR] [--max-trials 20] [--timeout 240]

Needs the zoo's MiniLM-L3 (``python bench/zoo/run.py --build-only --models minilm_l3``). The rows
(default: every row but the optional fp16/fp16-fused/weight4):

* ``fp32``: the model; ``fused``: quantune's ``transformer_opt`` at its defaults (fp32 fused);
* ``before``: quantune, zero-knowledge (static_quant and dynamic_quant flows, the zoo's config);
* ``after``: the same plus ``transformer_opt`` and ``weight_only`` (``flows: auto``);
* ``olive-bert``: Olive 0.13's BERT CPU recipe (transformer fusion -> OnnxQuantization ->
  OrtSessionParamsTuning, TPE; ``bench/tools/olive_tool.py bert``); when it gives no model,
  ``olive-bert-nosession`` (the same without session tuning) runs too;
* ``olive-bert-fastest``: from the same Olive run, the candidate Olive's own latency metric found
  fastest among those within the budget (Olive ranks its best accuracy first, as its example);
* ``inc-mse_v2-dynamic``: Neural Compressor 2.6 mse_v2, dynamic (the best peer on MiniLM-L3 in
  the peer bench);
* optional: ``fp16``, ``fp16-fused`` (``fp16`` at its defaults) and ``weight4`` (quantune,
  ``weight_only`` at 4 bits alone, objective size).

Every search row (quantune's and the peers') runs as the peer bench runs a tool
(``bench/run.py: run_tool``): its own process, cold cache, ``--max-trials``, its own limit 10%
below ``--timeout`` and killed at ``--timeout``. Then every row's model is scored with the case's
metric (Pearson r on the 50 Lee documents) and all are timed in ONE interleaved run (1 thread,
the first document; a model's own ``.session.json`` applies), ratios to fp32 with their paired
95% interval. Writes ``bench/results/passes-minilm-<date>.md`` and ``.json``.

``--reuse RUN_DIR`` takes the rows not named in ``--rows`` from an earlier run's folder (printed in
the result's header), so quantune's rows can be re-run alone on newer code and re-timed with the
peers' models: ``--rows before,after --reuse ~/.cache/quantune-zoo/runs/passes/<date>``. With
``--reuse`` and no ``--rows``, nothing is re-run: every row is re-scored and re-timed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import yaml

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import quantune  # noqa: E402
from quantune.evaluate.latency import LatencySpec, time_side_by_side  # noqa: E402
from quantune.evaluate.paired import paired_ratio  # noqa: E402
from quantune.passes import PassContext  # noqa: E402

ZOO = Path.home() / ".cache" / "quantune-zoo"
MODEL_DIR = ZOO / "minilm_l3"
RUNS = ZOO / "runs" / "passes"
RESULTS = BENCH / "results"
CASE = "minilm_l3"

ROWS = {  # row -> label, in the table's order
    "fp32": "fp32",
    "fused": "fp32 fused (quantune transformer_opt, defaults)",
    "fp16": "fp16 (quantune fp16, defaults)",
    "fp16-fused": "fp16 fused",
    "before": "quantune, without the new passes",
    "after": "quantune, with the new passes",
    "weight4": "quantune weight-only 4-bit (objective size)",
    "olive-bert": "Olive 0.13 BERT recipe (fusion + quantization + session tuning)",
    "olive-bert-fastest": "Olive 0.13 BERT recipe, its fastest candidate in budget",
    "olive-bert-nosession": "Olive 0.13 BERT recipe without session tuning",
    "olive-bert-nosession-fastest": "Olive 0.13 BERT recipe without session tuning, its fastest in budget",
    "inc-mse_v2-dynamic": "Neural Compressor 2.6 mse_v2, dynamic",
}
DEFAULT_ROWS = ("fp32", "fused", "before", "after", "olive-bert", "inc-mse_v2-dynamic")
PEERS = {  # row -> bench/run.py TOOLS entry (venv, script, arguments)
    "olive-bert": ("venv-olive", "olive_tool.py", ("bert",)),
    "olive-bert-nosession": ("venv-olive", "olive_tool.py", ("bert-nosession",)),
    "inc-mse_v2-dynamic": ("venv-inc", "inc_tool.py", ("mse_v2", "dynamic")),
}
QUANTUNE_ROWS = {  # row -> config beyond the zoo's (model, data, metric, budget)
    "before": {
        "passes": [{"name": "static_quant", "search": True}, {"name": "dynamic_quant", "search": True}],
        "flows": [["static_quant"], ["dynamic_quant"]],
        "search": {"strategy": "quantune"},
    },
    "after": {
        "passes": [
            {"name": "transformer_opt", "search": True},
            {"name": "static_quant", "search": True},
            {"name": "dynamic_quant", "search": True},
            {"name": "weight_only", "search": True},
        ],
        "flows": "auto",
        "search": {"strategy": "quantune"},
    },
    "weight4": {
        "objective": "size",
        "passes": [{"name": "weight_only", "search": True, "params": {"bits": 4}}],
        "search": {"strategy": "joint", "sampler": "tpe", "seed": 0},
    },
}
# rows read from another row's run: Olive's candidate its own latency metric found fastest among
# those within the budget (its best is ranked accuracy first, as in its BERT example)
DERIVED = {"olive-bert-fastest": "olive-bert", "olive-bert-nosession-fastest": "olive-bert-nosession"}
SINGLE_PASSES = {"fused": ("transformer_opt", "fp32"), "fp16": ("fp16", "fp32"), "fp16-fused": ("fp16", "fused")}


def log(message: str) -> None:
    print(f"[passes-minilm {time.strftime('%H:%M:%S')}] {message}", flush=True)


def bench_run():
    """bench/run.py, with this bench's peer rows added to its tools (its own list stays as it is)."""
    import run

    run.TOOLS.update(PEERS)
    return run


def case_spec(args, baseline: float) -> dict:
    """The case file every tool reads, as the peer bench writes it (bench/run.py: case_spec)."""
    from cases import CASES
    from run import case_spec as bench_spec

    spec = bench_spec(CASES[CASE], args.max_trials, args.timeout, 0.1)
    spec.pop("quantune_config")  # each quantune row has its own config here
    return {**spec, "zero_knowledge": False, "baseline": baseline}


def quantune_config(row: str, spec: dict, path: Path) -> Path:
    """The row's quantune config, every path absolute (it lives beside the row's folder, which the
    harness empties)."""
    config = {
        "model": spec["model"],
        "data": {
            "calibration": f"{MODEL_DIR / 'data.py'}:calibration",
            "evaluation": f"{MODEL_DIR / 'data.py'}:evaluation",
            "batch_size": 1,
        },
        "evaluation": {"metric": spec["metric"]},
        "criterion": {"type": "relative", "tolerable_loss": spec["tolerable_loss"]},
        "objective": "latency",
        **QUANTUNE_ROWS[row],
        "stop": {"max_trials": spec["max_trials"], "timeout_s": spec["timeout_s"]},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_search(row: str, spec: dict, run_dir: Path) -> dict:
    """One search row (quantune's or a peer's) through the peer bench's harness."""
    run = bench_run()
    folder = run_dir / row
    folder.mkdir(parents=True, exist_ok=True)
    case = dict(spec)
    tool = row
    if row in QUANTUNE_ROWS:
        case["quantune_config"] = str(quantune_config(row, spec, run_dir / f"{row}.yaml"))
        tool = "quantune"
    case_file = run_dir / f"{row}.case.json"
    case_file.write_text(json.dumps(case, indent=1))
    result = run.run_tool(tool, case_file, folder, spec["limit_s"])
    model = result.get("model")
    if result.get("status") != "ok":  # keep the original / closest miss / no model: no row model
        model = None
    return {
        "status": result.get("status"),
        "model": model,
        "tool_s": round(result.get("process_s", 0.0), 1),
        "evaluations": result.get("evaluations"),
        "first_feasible_s": result.get("first_feasible_s"),
        "detail": {k: result.get(k) for k in ("settings", "notes", "recipe") if result.get(k)},
        "fastest_in_budget": result.get("fastest_in_budget"),
        # what OrtSessionParamsTuning chose (reported; every row is timed at the bench's 1 thread)
        "session_options": (result.get("inference_settings") or {}).get("session_options"),
    }


def run_single_pass(row: str, models: dict[str, Path], run_dir: Path) -> dict:
    """One quantune pass at its defaults, outside any search (``fused``, ``fp16``, ``fp16-fused``)."""
    name, source = SINGLE_PASSES[row]
    if source not in models:
        return {"status": f"needs the '{source}' row", "model": None}
    cls = quantune.get_pass(name)
    out = run_dir / row / "model.onnx"
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        cls().run(cls.Config(), models[source], out, PassContext(None, ["input_ids", "attention_mask"], 1, out.parent))
    except Exception as exc:  # the row keeps the error, the others still run
        return {"status": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}", "model": None}
    return {"status": "ok", "model": str(out), "tool_s": round(time.perf_counter() - started, 1)}


def score(path: Path, data, metric) -> float:
    from common import run_model, view

    return float(metric(run_model(path, data, 1), view(data)))


def size_bytes(path: Path) -> int:
    return path.stat().st_size + sum(p.stat().st_size for p in path.parent.glob("*.data"))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", help=f"rows to run (default {','.join(DEFAULT_ROWS)}; see the docstring)")
    parser.add_argument("--reuse", type=Path, help="an earlier run's folder: rows not in --rows come from it")
    parser.add_argument("--max-trials", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=240, help="each search row's limit (s), as the peer bench")
    parser.add_argument("--repeats", type=int, default=100, help="interleaved timing rounds")
    args = parser.parse_args()
    chosen = args.rows.split(",") if args.rows else ([] if args.reuse else list(DEFAULT_ROWS))
    unknown = [row for row in chosen if row not in ROWS or row in DERIVED]
    if unknown:
        parser.error(f"--rows: unknown {unknown}; rows: {','.join(r for r in ROWS if r not in DERIVED)}")
    if args.reuse is not None and not (args.reuse / "rows.json").is_file():
        parser.error(f"--reuse: {args.reuse} has no rows.json (give a folder under {RUNS})")
    args.chosen = [row for row in ROWS if row in chosen or row == "fp32"]
    return args


def main() -> int:
    args = parse_args()
    if not (MODEL_DIR / ".built").is_file():
        print("build MiniLM-L3 first: python bench/zoo/run.py --build-only --models minilm_l3", file=sys.stderr)
        return 2
    bench_run().zoo_run().run_config(CASE, None, None)  # links this checkout's data.py/metric.py beside the model
    from common import load_data, load_metric

    started = time.perf_counter()
    load_start = os.getloadavg()
    stamp = time.strftime("%Y-%m-%d-%H%M", time.gmtime())
    if (RUNS / stamp).exists():  # a run of the same minute (maybe the one --reuse names) is kept
        stamp = time.strftime("%Y-%m-%d-%H%M%S", time.gmtime())
    run_dir = RUNS / stamp
    run_dir.mkdir(parents=True)
    rows: dict[str, dict] = {}
    if args.reuse is not None:
        earlier = json.loads((args.reuse / "rows.json").read_text())
        rows = {row: {**entry, "reused_from": str(args.reuse)} for row, entry in earlier.items() if row != "fp32"}
    rows["fp32"] = {"status": "reference", "model": str(MODEL_DIR / "model.onnx")}
    data = load_data(MODEL_DIR / "eval_feeds.npz")
    spec = case_spec(args, 0.0)
    metric = load_metric(spec["metric"])
    spec["baseline"] = score(Path(rows["fp32"]["model"]), data, metric)
    chosen = list(args.chosen)
    for row in ROWS:
        if row not in chosen or row == "fp32":
            continue
        log(f"running {row}")
        rows.pop(f"{row}-fastest", None)  # an earlier run's derived row goes with the row it came from
        models = {name: Path(entry["model"]) for name, entry in rows.items() if entry.get("model")}
        if row in SINGLE_PASSES:
            rows[row] = run_single_pass(row, models, run_dir)
        else:
            rows[row] = run_search(row, spec, run_dir)
        log(f"{row}: {rows[row]['status']} ({rows[row].get('tool_s')} s)")
        fastest = rows[row].get("fastest_in_budget")
        if fastest and fastest["model"] != rows[row]["model"]:
            rows[f"{row}-fastest"] = {
                "status": f"from the {row} run (Olive's latency {fastest['olive_latency_avg_ms']:.1f} ms)",
                "model": fastest["model"],
                "detail": {"recipe": fastest["recipe"]},
            }
        if row == "olive-bert" and not rows[row]["model"] and "olive-bert-nosession" not in chosen:
            chosen.append("olive-bert-nosession")  # the nearest variant, in a second row
    order = [row for row in ROWS if row in rows]
    rows = {row: rows[row] for row in order}
    (run_dir / "rows.json").write_text(json.dumps(rows, indent=1, default=str))
    timed = [row for row, entry in rows.items() if entry.get("model") and Path(entry["model"]).is_file()]
    log(f"scoring and timing {len(timed)} models side by side")
    for row in timed:
        rows[row]["pearson_r"] = score(Path(rows[row]["model"]), data, metric)
    load_timing = os.getloadavg()
    timing_spec = LatencySpec(warmup=10, repeats=args.repeats, threads=1)
    timings = time_side_by_side([Path(rows[row]["model"]) for row in timed], data[0], timing_spec)
    fp32_size = size_bytes(Path(rows["fp32"]["model"]))
    for index, row in enumerate(timed):
        ratio = paired_ratio(timings[index], timings[0])
        value = rows[row]["pearson_r"]
        rows[row].update(
            loss_pct=100 * (spec["baseline"] - value) / spec["baseline"],
            in_budget=bool((spec["baseline"] - value) / spec["baseline"] <= spec["tolerable_loss"] + 1e-12),
            latency_ms=float(np.median(timings[index])) * 1000,
            ratio=ratio.median,
            ratio_interval=[ratio.low, ratio.high],
            size_mb=size_bytes(Path(rows[row]["model"])) / 1e6,
            size_ratio=size_bytes(Path(rows[row]["model"])) / fp32_size,
        )
    report = {
        "date": stamp,
        "command": command_line(),
        "run_dir": str(run_dir),
        "wall_s": round(time.perf_counter() - started, 1),
        "load_average": {"start": load_start, "timing": load_timing, "end": os.getloadavg()},
        "limits": {"max_trials": args.max_trials, "limit_s": args.timeout, "own_limit_s": spec["timeout_s"]},
        "timing": vars(timing_spec),
        "baseline_r": spec["baseline"],
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"passes-minilm-{stamp}.json").write_text(json.dumps(report, indent=1, default=str))
    text = markdown(report)
    (RESULTS / f"passes-minilm-{stamp}.md").write_text(text)
    print(text)
    log(f"wrote bench/results/passes-minilm-{stamp}.md/.json (models in {run_dir})")
    return 0


def command_line() -> str:
    return "python bench/passes_minilm.py " + " ".join(sys.argv[1:])


def markdown(report: dict) -> str:
    load = report["load_average"]
    lines = [
        f"# MiniLM-L3, 1% budget: quantune and the peers side by side ({report['date']} UTC)",
        "",
        f"`{report['command'].strip()}` ({report['wall_s'] / 60:.1f} min in all; models in `{report['run_dir']}`).",
        "",
        f"Each search row ran as the peer bench runs a tool: own process, cold cache, at most "
        f"{report['limits']['max_trials']} trials, its own limit {report['limits']['own_limit_s']:.0f} s, killed at "
        f"{report['limits']['limit_s']:.0f} s. Every model scored with the case's metric (Pearson r on the 50 Lee "
        f"documents; fp32 {report['baseline_r']:.4f}) and timed in ONE interleaved run ({report['timing']['repeats']} "
        "rounds, 1 thread, batch 1, the first document); ratio = median of per-round ratios to fp32 with its paired "
        f"95% interval. Load average (1 min) {load['start'][0]:.1f} at the start, {load['timing'][0]:.1f} at the "
        f"timing, {load['end'][0]:.1f} at the end, on a 2-core machine shared with other jobs: read the ratios, "
        "not the milliseconds.",
        "",
        "| row | in budget | latency vs fp32 (95% CI) | r | loss | size MB (vs fp32) | tool time s | status |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row, entry in report["rows"].items():
        label = ROWS[row] + (" (reused)" if entry.get("reused_from") else "")
        if "ratio" in entry:
            low, high = entry["ratio_interval"]
            cells = [
                {True: "yes", False: "no"}[entry["in_budget"]],
                f"{entry['ratio']:.3f}x ({low:.3f}-{high:.3f})",
                f"{entry['pearson_r']:.4f}",
                f"{entry['loss_pct']:+.2f}%",
                f"{entry['size_mb']:.2f} ({entry['size_ratio']:.3f}x)",
            ]
        else:
            cells = ["-"] * 5
        tool_s = entry.get("tool_s")
        status = str(entry.get("status", "")).replace("|", "/")[:160]
        lines.append(f"| {label} | " + " | ".join([*cells, "-" if tool_s is None else f"{tool_s}", status]) + " |")
    lines += ["", "What each search row chose:", ""]
    for row, entry in report["rows"].items():
        detail = dict(entry.get("detail") or {})
        if entry.get("session_options"):
            detail["session options (OrtSessionParamsTuning)"] = entry["session_options"]
        if detail:
            lines.append(f"- `{row}`: {short(detail)}")
    lines += [
        "",
        "Olive picks its best candidate by its metrics' priorities (accuracy 1, latency 2, as in its BERT "
        "example), among the candidates within the budget; its session tuning's thread counts are reported, not "
        "applied: every row is timed at the same 1 intra-op thread.",
    ]
    return "\n".join(lines) + "\n"


def short(detail: dict) -> str:
    """Node lists shown by their length (a fallback can name a hundred nodes)."""
    shown = {}
    for key, value in detail.items():
        if isinstance(value, dict):
            value = {k: f"<{len(v)} nodes>" if isinstance(v, list) and len(v) > 4 else v for k, v in value.items()}
        shown[key] = value
    return json.dumps(shown, default=str)


if __name__ == "__main__":
    sys.exit(main())
