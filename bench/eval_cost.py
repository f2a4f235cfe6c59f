"""What one evaluation of the original and one batch-1 run cost, per zoo model: which ones are heavy.

    python bench/eval_cost.py [--cases NAME,...] [--out bench/results]

Issue 41 calls a model heavy when a single batch-1 run takes >= 0.3 s or one evaluation of the
original takes >= 30 s, each as its zoo config runs it. Per bench case (default: every zoo case
of ``bench/cases.py``), in one process, one model after another:

- *batch-1 run*: the first evaluation row (or feed) on the bench's timing session (CPU provider,
  one thread, sequential), the fastest and the median of ``--repeats`` runs after one warm-up
  (on a shared machine the fastest is the closest to the model's own cost);
- *evaluation*: every evaluation batch at the config's batch size on the default session
  (``bench/common.run_model``), then the config's metric, timed once; the metric is called once
  before (an agreement metric computes and caches the fp32 reference on its first call).

Each row notes the machine's 1-minute load average when it ended: the figures are wall times.
``--relative A,B,...``: the batch-1 runs of those cases instead, one of each per round for
``--repeats`` rounds in one process, as multiples of the first case's (a load that slows every
model alike cancels out of the ratio).

Prints a markdown table and writes ``eval-cost-<date>.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from cases import CASES, ZOO_CASES
from common import batches, load_data, load_metric, open_model, run_model, view
from run import ensure_built

HEAVY_RUN_S, HEAVY_EVALUATION_S = 0.3, 30.0


def first_row(data, names: list[str]) -> dict[str, np.ndarray]:
    return next(batches(data, names, batch_size=1))


def cost(name: str, repeats: int) -> dict:
    case = CASES[name]
    ensure_built(case)  # links the zoo model's metric script beside its data
    data = load_data(case.folder / case.evaluation_file)
    run, names, _ = open_model(case.model)
    row = first_row(data, names)
    run(row)
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        run(row)
        seconds.append(time.perf_counter() - started)
    metric = load_metric(case.metric_spec())
    outputs = run_model(case.model, data, case.batch_size)
    metric(outputs, view(data))  # an agreement metric's first call computes its fp32 reference
    started = time.perf_counter()
    outputs = run_model(case.model, data, case.batch_size)
    ran = time.perf_counter() - started
    value = metric(outputs, view(data))
    evaluation = time.perf_counter() - started
    rows = len(data) if isinstance(data, list) else len(data[names[0]])
    batch_1 = float(np.min(seconds))
    return {
        "case": name,
        "rows": rows,
        "batch_size": case.batch_size,
        "batch1_s": batch_1,
        "batch1_median_s": float(np.median(seconds)),
        "run_s": ran,
        "evaluation_s": evaluation,
        "metric": value,
        "load": os.getloadavg()[0],
        "heavy": batch_1 >= HEAVY_RUN_S or evaluation >= HEAVY_EVALUATION_S,
    }


def relative(names: list[str], rounds: int) -> str:
    runs = {}
    for name in names:
        case = CASES[name]
        ensure_built(case)
        run, inputs, _ = open_model(case.model)
        row = first_row(load_data(case.folder / case.evaluation_file), inputs)
        run(row)
        runs[name] = (run, row)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name, (run, row) in runs.items():
            started = time.perf_counter()
            run(row)
            seconds[name].append(time.perf_counter() - started)
    first = float(np.median(seconds[names[0]]))
    lines = [f"| model | batch-1 run (s, 1 thread): fastest / median | median vs `{names[0]}` |", "| --- | --- | --- |"]
    for name, values in seconds.items():
        median = float(np.median(values))
        lines.append(f"| `{name}` | {min(values):.3f} / {median:.3f} | {median / first:.2f}x |")
    return "\n".join([*lines, "", f"{rounds} interleaved rounds; load average {os.getloadavg()[0]:.1f} at the end."])


def table(rows: list[dict]) -> str:
    lines = [
        "| model | evaluation rows (batch) | batch-1 run (s, 1 thread): fastest / median | evaluation: runs (s) "
        "| evaluation with metric (s) | heavy | load average |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| `{r['case']}` | {r['rows']} ({r['batch_size']}) | {r['batch1_s']:.3f} / {r['batch1_median_s']:.3f} "
            f"| {r['run_s']:.1f} | {r['evaluation_s']:.1f} | {'**yes**' if r['heavy'] else 'no'} | {r['load']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(ZOO_CASES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--relative", default="", help="cases whose batch-1 runs are timed interleaved, vs the first")
    args = parser.parse_args()
    if args.relative:
        print(relative(args.relative.split(","), args.repeats))
        return
    rows = []
    for name in args.cases.split(","):
        rows.append(cost(name, args.repeats))
        print(f"{name}: batch-1 {rows[-1]['batch1_s']:.3f} s, evaluation {rows[-1]['evaluation_s']:.1f} s", flush=True)
    text = table(rows)
    print(text)
    if args.out:
        path = args.out / f"eval-cost-{time.strftime('%Y-%m-%d-%H%M', time.gmtime())}.md"
        command = f"python bench/eval_cost.py --cases {args.cases} --repeats {args.repeats} --out {args.out}"
        header = f"# One evaluation of the original and one batch-1 run, per zoo model\n\n```sh\n{command}\n```\n\n"
        note = (
            f"Heavy (issue 41): batch-1 run >= {HEAVY_RUN_S} s or evaluation >= {HEAVY_EVALUATION_S:.0f} s. "
            "Measured under load (other engineers' tests and a bench run on this 2-core machine): "
            "the load average column says how much.\n\n"
        )
        path.write_text(header + note + text + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
