"""The ``quantune`` command: run, check, report, schema, passes, space.

User mistakes (a bad config, a missing file, a read-only folder) print one line naming the
field or file and exit with code 2; a fault of the machine (a full disk) prints one line and
exits with 1; SIGINT and SIGTERM stop a run as Ctrl-C does (exit 130 and 143). None of these
show a traceback.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import signal
import sys
from collections.abc import Sequence

from rich.console import Console

from quantune.errors import EnvironmentFault, QuantuneError

EXIT_USER_ERROR = 2
EXIT_ENVIRONMENT = 1


def _cmd_run(args: argparse.Namespace) -> int:
    from quantune.api import tune
    from quantune.engine.interrupts import EXIT_CODES, install_stop_signals
    from quantune.report.console import ConsoleListener, render_result

    install_stop_signals()
    listeners = [] if args.quiet else [ConsoleListener()]
    result = tune(
        args.config,
        args.output,
        restart=args.restart,
        listeners=listeners,
        workers=args.workers,
        executor=args.executor,
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
    from quantune.config import config_json_schema

    print(json.dumps(config_json_schema(), indent=2))
    return 0


def _cmd_passes(args: argparse.Namespace) -> int:
    from rich.table import Table

    from quantune.passes import get_pass, pass_names

    table = Table(title="passes")
    for column in ("name", "parameter", "default", "default search values"):
        table.add_column(column)
    for name in pass_names():
        pass_cls = get_pass(name)
        for index, (param, field) in enumerate(pass_cls.Config.model_fields.items()):
            space = pass_cls.search_space.get(param)
            joint = next((n for n, j in pass_cls.search_space.items() if param in getattr(j, "names", ())), None)
            if space is None and joint is not None:  # a default joint (fast_finetune's num_iter_lr)
                searched = f"with {joint}: {[list(v) for v in pass_cls.search_space[joint].values]}"
            elif space is None:
                searched = ""
            elif hasattr(space, "cases"):
                searched = "; ".join(f"when {k[0]}: {list(v)}" for k, v in space.cases.items())
            elif hasattr(space, "choices"):
                searched = ", ".join(map(str, space.choices))
            else:
                searched = repr(space)
            table.add_row(name if index == 0 else "", param, repr(field.default), searched)
    Console().print(table)
    return 0


def _cmd_space(args: argparse.Namespace) -> int:
    from quantune.config import load_config
    from quantune.engine.setup import build_run
    from quantune.space.report import describe_space

    loaded = load_config(args.config)
    # The run's own plan: the model prepared (cached) and the points it cannot run pruned.
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
    from quantune.api import check
    from quantune.config import load_config

    metric = load_config(args.config).config.evaluation.metric
    metrics = check(args.config)
    print(f"ok: the data fits the model and the original scores {metric} = {metrics[metric]:.6g}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quantune", description="Search for the best optimized ONNX model.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="tune a model as a config says")
    run.add_argument("config", help="YAML or JSON config file")
    run.add_argument("--output", "-o", help="output folder (default: runs/<config name>)")
    run.add_argument("--restart", action="store_true", help="replace a run of another config in --output")
    run.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    run.add_argument("--workers", "-j", type=int, help="trials run at once (overrides executor.workers)")
    run.add_argument(
        "--executor", choices=["process", "inline", "ray"], help="where trials run (overrides executor.kind)"
    )
    run.set_defaults(func=_cmd_run)

    report = sub.add_parser("report", help="write report.html (plots and the trial table) for a run folder")
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
    check.set_defaults(func=_cmd_check)

    space = sub.add_parser("space", help="print the size of a config's search space and sample points")
    space.add_argument("config")
    space.add_argument("--samples", type=int, default=5)
    space.set_defaults(func=_cmd_space)
    return parser


def one_line(message: str) -> str:
    """``message`` as one printable line: a newline or control character (a config key can hold
    one) is shown escaped, never as a break."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in message)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.raiseExceptions = False  # a log line that cannot be written (disk full) is no traceback
    try:
        return args.func(args)
    except QuantuneError as exc:
        print(f"quantune: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USER_ERROR
    except EnvironmentFault as exc:
        print(f"quantune: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(f"quantune: error: No space left on device writing {exc.filename or 'a file'}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except KeyboardInterrupt as exc:
        from quantune.engine.interrupts import exit_code, stop_cause

        print(f"quantune: interrupted ({stop_cause(exc)})", file=sys.stderr)
        return exit_code(exc)
    except BrokenPipeError:  # output piped into head and friends
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
