"""quantune's timeline from process start: when each phase ends, and when the first in-budget
quantized model comes in (issue 10: at most the fastest peer's time, counted the same way).

Each model runs ``quantune run`` cold (fresh output and cache folders) in a child process; the
child logs every record of the ``quantune`` loggers with its time since the process started
(taken by this parent just before starting it), so the rows are comparable with the peer bench
(bench/results/peers-*.md, which also counts from process start).

    PYTHONPATH=src python bench/startup.py                          # minilm_l3 and captcha_ddddocr
    PYTHONPATH=src python bench/startup.py --models minilm_l3 --timeout 60 --repeat 2
    PYTHONPATH=src python bench/startup.py --models digits --timeout 10 --repeat 3   # a < 2 MB model
    PYTHONPATH=src python bench/startup.py --models digits-zk --repeat 5   # as the peer bench runs it
    python bench/startup.py --src /work/main/src --src src          # two checkouts, run alternately

With several ``--src``, each model runs once per checkout, alternating, so a before/after
comparison shares the machine's load as far as runs taken one after the other can.

The zoo's files must be built first: ``python bench/zoo/run.py --build-only --models minilm_l3,captcha_ddddocr``.
Timings are of one run on a shared machine: read them with the load (printed) in mind.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / "bench" / "zoo"
# models under 2 MB from examples/ (no zoo build needed): issue 23's start-up goal is on these
EXAMPLES = {
    "digits": ROOT / "examples" / "digits" / "config.yaml",
    "digits-zk": ROOT / "examples" / "digits" / "config.yaml",
}
# digits-zk: the digits example as the peer bench runs it (bench/tools/quantune_tool.py, a zero-knowledge
# case): both quantization flows searched, strategy quantune -- the first guess, then the speed ceilings
ZERO_KNOWLEDGE = [
    "passes=[{name: static_quant, search: true}, {name: dynamic_quant, search: true}]",
    "flows=[[static_quant], [dynamic_quant]]",
    "search={strategy: quantune}",
]


def _child(argv: list[str]) -> int:
    """In the child: timestamps every ``quantune`` log record, then runs the CLI."""
    t0 = float(os.environ["QUANTUNE_BENCH_T0"])
    out = open(os.environ["QUANTUNE_BENCH_TIMELINE"], "a", buffering=1)  # noqa: SIM115 - lives with the process

    def mark(what: str) -> None:
        out.write(f"{time.time() - t0:.2f}\t{what}\n")

    mark("python started")
    import logging

    import quantune.cli

    mark("imports (quantune.cli)")

    class Timeline(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if record.name.startswith("quantune"):
                mark(message[:160].replace("\n", " "))

    root = logging.getLogger()
    root.addHandler(Timeline(logging.INFO))
    root.setLevel(logging.INFO)
    code = quantune.cli.main(argv)
    mark("cli returned")
    return code


def _rows(timeline: Path) -> list[tuple[float, str]]:
    rows = []
    for line in timeline.read_text().splitlines():
        seconds, _, what = line.partition("\t")
        rows.append((float(seconds), what))
    return rows


def _summary(rows: list[tuple[float, str]], results: dict, wall: float) -> dict[str, float | str]:
    """Phase -> seconds from process start (the end of the phase)."""
    phases: dict[str, float | str] = {}

    def first(pattern: str, name: str) -> None:
        for seconds, what in rows:
            if re.search(pattern, what):
                phases.setdefault(name, seconds)
                return

    first(r"^python started", "python started")
    first(r"^imports", "imports")
    first(r"^set-up \(", "set-up (data, preparation)")
    first(r"^baseline_evaluation stage|^baseline \(", "baseline evaluated")
    first(r"^ceiling_build stage", "ceilings built (beside the baseline)")
    first(r"^node_profile stage", "node profile")
    first(r"^speed_ceiling stage|^quantune strategy: .*(kept|dropped)", "ceilings timed")
    trials = [(s, int(m.group(1))) for s, w in rows if (m := re.match(r"trial (\d+): ", w))]
    for seconds, number in trials[:2]:
        phases[f"trial {number}"] = seconds
    first(r"^sensitivity stage", "sensitivity")
    in_budget = [
        t["number"]
        for t in results.get("trials", [])
        if t.get("meets_criterion") and (t.get("metrics") or {}).get("quantized_ops", 0) > 0
    ]
    if in_budget:
        number = min(in_budget, key=lambda n: next((s for s, k in trials if k == n), 1e9))
        phases[f"first in-budget quantized (trial {number})"] = next(s for s, k in trials if k == number)
    if trials:
        phases[f"last trial ({len(trials)} ran)"] = trials[-1][0]
    first(r"^search stopped", "search stopped")
    first(r"^search and re-timing done", "re-timing done")
    first(r"^results written", "results written")
    first(r"^cli returned", "report drawn, cli returned")
    phases["process exit"] = wall
    confirmation = results.get("latency_confirmation") or {}
    phases["re-timing rounds"] = confirmation.get("rounds", confirmation.get("skipped", "-"))
    phases["stop reason"] = results.get("stop_reason", "-")
    return phases


def run_one(model: str, timeout: float, python: str, src: Path = ROOT / "src") -> dict[str, float | str]:
    config = EXAMPLES[model] if model in EXAMPLES else ZOO / model / "config.yaml"
    if not (config.parent / "model.onnx").is_file():
        raise SystemExit(f"{model}: build the zoo first: python bench/zoo/run.py --build-only --models {model}")
    with tempfile.TemporaryDirectory(prefix=f"startup-{model}-") as tmp:
        timeline = Path(tmp) / "timeline.tsv"
        output = Path(tmp) / "out"
        argv = ["run", str(config), "--output", str(output), "--quiet"]
        argv += ["--set", f"stop.timeout_s={timeout:g}", "--set", f"cache_dir={Path(tmp) / 'cache'}"]
        for setting in ZERO_KNOWLEDGE if model.endswith("-zk") else []:
            argv += ["--set", setting]
        env = dict(os.environ, QUANTUNE_BENCH_TIMELINE=str(timeline))
        env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        t0 = time.time()
        env["QUANTUNE_BENCH_T0"] = repr(t0)
        proc = subprocess.run(
            [python, __file__, "--child", *argv], env=env, capture_output=True, text=True, check=False
        )
        wall = time.time() - t0
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
        results = json.loads((output / "results.json").read_text()) if (output / "results.json").is_file() else {}
        if os.environ.get("STARTUP_KEEP"):
            print((timeline).read_text(), file=sys.stderr)
        return _summary(_rows(timeline), results, wall)


def _table(columns: dict[str, dict[str, float | str]]) -> str:
    names = list(dict.fromkeys(name for phases in columns.values() for name in phases))
    lines = ["| phase (s from process start) | " + " | ".join(columns) + " |"]
    lines.append("| --- |" + " --- |" * len(columns))
    for name in names:
        cells = []
        for phases in columns.values():
            value = phases.get(name, "")
            cells.append(f"{value:.1f}" if isinstance(value, float) else str(value))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return _child(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm_l3,captcha_ddddocr")
    parser.add_argument("--timeout", type=float, default=60.0, help="stop.timeout_s (the peer bench's limit)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--src", action="append", type=Path, help="a checkout's src folder (repeatable)")
    args = parser.parse_args()
    sources = [path.resolve() for path in args.src or [ROOT / "src"]]
    load_before = os.getloadavg()[0]
    columns = {}
    for model in args.models.split(","):
        for index in range(args.repeat):
            for src in sources:
                name = model if args.repeat == 1 else f"{model} #{index + 1}"
                if len(sources) > 1:
                    name += f" ({src.parent.name})"
                columns[name] = run_one(model, args.timeout, args.python, src)
    print(f"load average (1 min) before/after: {load_before:.2f}/{os.getloadavg()[0]:.2f}, {os.cpu_count()} cores")
    print(_table(columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
