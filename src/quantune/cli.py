"""The ``quantune`` command: run, check, report, schema, passes, space.

A user mistake prints one line naming the field or file (exit 2), a machine fault one line (exit
1); SIGINT and SIGTERM stop a run as Ctrl-C does (130, 143). None shows a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console

from quantune.errors import EnvironmentFault, QuantuneError

if TYPE_CHECKING:
    from quantune.config import LoadedConfig

EXIT_USER_ERROR = 2
EXIT_ENVIRONMENT = 1


def _cmd_run(args: argparse.Namespace) -> int:
    if _forks_workers(args):
        # the fork server imports the heavy modules while this process validates the config
        from quantune.forkserver import warm_up

        warm_up()
    loaded = _load(args)
    from quantune.api import tune
    from quantune.engine.run.deadline import process_started
    from quantune.engine.run.interrupts import EXIT_CODES, install_stop_signals
    from quantune.report.console import ConsoleListener, render_result

    install_stop_signals()
    listeners = [] if args.quiet else [ConsoleListener()]
    with listeners[0].showing_stages() if listeners else contextlib.nullcontext():
        result = tune(
            loaded,
            args.output,
            restart=args.restart,
            listeners=listeners,
            workers=args.workers,
            executor=args.executor,
            started=process_started(),  # stop.timeout_s counts from the command's start
        )
    render_result(result, Console())
    if not result.interrupted:
        return 0
    return EXIT_CODES[signal.SIGTERM] if "SIGTERM" in result.stop_reason else EXIT_CODES[signal.SIGINT]


def _cmd_report(args: argparse.Namespace) -> int:
    from quantune.report.html import write_report

    print(write_report(args.run_dir, args.output))
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    from quantune.schema import config_json_schema

    print(json.dumps(config_json_schema(), indent=2))
    return 0


def _cmd_passes(args: argparse.Namespace) -> int:
    from quantune.report.passes_table import render_passes

    render_passes(Console())
    return 0


def _cmd_space(args: argparse.Namespace) -> int:
    from quantune.engine.trials.setup import build_run
    from quantune.space.report import describe_space

    loaded = _load(args)
    parts = build_run(loaded)
    plan = parts.plan
    preparation = parts.context.preparation
    for line in preparation.steps if preparation else []:
        print(f"prepared: {line}")
    for line in preparation.warnings if preparation else []:
        print(f"prepare: {line}")
    print(f"{len(plan.flows)} flow(s); joint space over {len(plan.space)} parameter(s)")
    for name in plan.flows:
        print()
        print(describe_space(f"flow {name}", plan.flow_space(name), samples=args.samples))
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from quantune import progress
    from quantune.engine.measure.baseline import original_costs
    from quantune.engine.trials.setup import build_run, preflight
    from quantune.forkserver import refuse_in_starting_worker
    from quantune.report.check_summary import check_lines, cost_lines
    from quantune.report.console import ConsoleListener

    refuse_in_starting_worker()
    loaded = _load(args)
    metric = loaded.config.evaluation.metric
    from quantune.engine.trials.limits import check_watchdog

    # the loader and the metric run here: never for ever; each step says how far it is
    with check_watchdog(loaded.config), ConsoleListener().showing_stages():
        with progress.stage("preparing the model"):
            parts = build_run(loaded)
        with progress.stage("measuring the original"):  # its evaluation batches, then its timing's rounds
            metrics = preflight(parts)  # what quantune.check(config) does
    for line in check_lines(parts, metrics) + cost_lines(loaded.config, parts, *original_costs(parts.context)):
        print(line)
    print(f"ok: the data fits the model and the original scores {metric} = {metrics[metric]:.6g}")
    return 0


def _cmd_init(args: argparse.Namespace) -> int:
    from quantune.starter import init_project

    result = init_project(args.model, args.data, args.metric, args.output)
    info = result.info
    print(f"model: {info.path} (opset {info.opset}): {info.compute_summary()}")
    for spec in info.inputs:
        print(f"  input  {spec.describe()}")
    for spec in info.outputs[:6]:
        print(f"  output {spec.describe()}")
    print(f"data: {result.source.kind}{' (read directly)' if result.source.direct else ' (read by data.py)'}")
    print(f"metric: {result.metric}")
    for path in result.written:
        print(f"wrote {path}")
    for note in result.notes:
        print(f"note: {note}")
    print("next:")
    for command in result.next_commands():
        print(f"  {command}")
    return 0


def _version_text() -> str:
    """quantune's version and those of the libraries that do the work (figures depend on them)."""
    import platform

    from quantune import __version__

    parts = [f"quantune {__version__}"]
    for name in ("onnxruntime", "onnx", "numpy", "optuna"):
        try:
            from importlib.metadata import version

            parts.append(f"{name} {version(name)}")
        except Exception:
            parts.append(f"{name} (not installed)")
    parts.append(f"Python {platform.python_version()}")
    return ", ".join(parts)


class _VersionAction(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print versions and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        print(_version_text())
        parser.exit()


def _forks_workers(args: argparse.Namespace) -> bool:
    """Whether the run will fork its workers, read before the config is validated (``will_fork``)."""
    from quantune.forkserver import will_fork

    hint = {}  # ``--set executor.kind=...`` without the config package (parse_set imports pydantic)
    for item in args.set or []:
        key, _, value = item.partition("=")
        if key.strip() == "executor.kind":
            hint["executor.kind"] = value.strip().strip("'\"")
    return will_fork(args.config, args.executor, hint)


def _load(args: argparse.Namespace) -> LoadedConfig:
    """The command's config with its ``--set`` overrides applied and validated like the file."""
    from quantune.config import load_config
    from quantune.config.overrides import parse_set

    return load_config(args.config, parse_set(args.set), cli=True)


def _add_set(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set stop.max_trials=5 (YAML value; repeat for more)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quantune", description="Search for the best optimized ONNX model.")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)

    init = sub.add_parser(
        "init", help="write a starter quantune.yaml (and data.py / metric.py when needed) for a model"
    )
    init.add_argument("model", help="the ONNX model")
    init.add_argument(
        "--data",
        nargs="+",
        metavar="DIR_OR_FILES",
        help="a folder of images or .npy files, or .npz/.npy files (default: a loader of random inputs)",
    )
    init.add_argument(
        "--metric", help="top1, top1_agreement, cosine, l2, max_abs_diff, custom (writes metric.py), or script.py:fn"
    )
    init.add_argument("--output", "-o", default="quantune.yaml", help="the config to write (default: quantune.yaml)")
    init.set_defaults(func=_cmd_init)

    run = sub.add_parser("run", help="tune a model as a config says")
    run.add_argument("config", help="YAML or JSON config file")
    run.add_argument("--output", "-o", help="output folder (default: runs/<config name>)")
    run.add_argument("--restart", action="store_true", help="replace a run of another config in --output")
    run.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    run.add_argument("--workers", "-j", type=int, help="trials run at once (overrides executor.workers)")
    run.add_argument(
        "--executor", choices=["process", "inline", "ray"], help="where trials run (overrides executor.kind)"
    )
    _add_set(run)
    run.set_defaults(func=_cmd_run)

    report = sub.add_parser(
        "report", help="write report.html (interactive, offline) and optuna.journal for a run folder"
    )
    report.add_argument("run_dir", help="a run's --output folder (it holds results.json)")
    report.add_argument("--output", help="where to write the page (default: RUN_DIR/report.html)")
    report.set_defaults(func=_cmd_report)

    schema = sub.add_parser("schema", help="print the config's JSON Schema")
    schema.set_defaults(func=_cmd_schema)

    passes = sub.add_parser("passes", help="list passes, their parameters and default search values")
    passes.set_defaults(func=_cmd_passes)

    check = sub.add_parser(
        "check", help="preflight only: check the data against the model and the metric on the original"
    )
    check.add_argument("config")
    _add_set(check)
    check.set_defaults(func=_cmd_check)

    space = sub.add_parser("space", help="print the size of a config's search space and sample points")
    space.add_argument("config")
    space.add_argument("--samples", type=int, default=5)
    _add_set(space)
    space.set_defaults(func=_cmd_space)
    return parser


def one_line(message: str) -> str:
    """``message`` as one printable line: a newline or control character (a config key can hold
    one) is shown escaped, never as a break."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in message)


class _OneLineWarnings(logging.Handler):
    """Python's last-resort warning output (before ``quantune.log`` exists) as one line each, said
    when the command ends: a worker's log tail belongs in a log, not on a user's console."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        lines = record.getMessage().strip().splitlines() or [""]
        self.lines.append(f"quantune: warning: {one_line(lines[0])}")

    def flush_to_stderr(self) -> None:
        for line in dict.fromkeys(self.lines):
            print(line, file=sys.stderr)
        self.lines.clear()


def entry() -> None:
    """The ``quantune`` command: :func:`main`, then the process ends without the interpreter's teardown.

    Tearing down a run's objects takes time a user waits for after the verdict. The exit handlers
    still run and the streams are flushed; with other threads left, the usual exit waits for them.
    """
    import atexit
    import threading

    code = main()
    if threading.active_count() > 1:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()  # what sys.exit would run: logging.shutdown, multiprocessing's clean-up, finalizers
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.raiseExceptions = False  # a log line that cannot be written (disk full) is no traceback
    warnings, last_resort = _OneLineWarnings(), logging.lastResort
    logging.lastResort = warnings  # before the run's log file exists: a warning is one line
    try:
        return _main(args, warnings)
    finally:
        logging.lastResort = last_resort


def _main(args: argparse.Namespace, warnings: _OneLineWarnings) -> int:
    try:
        code = args.func(args)
        warnings.flush_to_stderr()
        sys.stdout.flush()  # a closed pipe fails here, inside the handler below, not at exit
        return code
    except BrokenPipeError:  # output piped into head and friends: stop quietly (Python's documented way)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit goes nowhere
        return 0
    except QuantuneError as exc:
        print(f"quantune: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USER_ERROR
    except EnvironmentFault as exc:
        print(f"quantune: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            if not exc.filename:
                raise
            print(f"quantune: error: '{exc.filename}': {exc.strerror or exc}", file=sys.stderr)  # a path in the way
            return EXIT_USER_ERROR
        from quantune.store.faults import written_path

        print(f"quantune: error: No space left on device writing {written_path(exc)}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except KeyboardInterrupt as exc:
        from quantune.engine.run.interrupts import exit_code, stop_cause

        print(f"quantune: interrupted ({stop_cause(exc)})", file=sys.stderr)
        return exit_code(exc)


if __name__ == "__main__":
    sys.exit(main())
