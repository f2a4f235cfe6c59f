"""What a person sees in the terminal: a progress bar while trials run, then a table."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from quantune import progress
from quantune.engine.outcome.deploy import deploy_sentence
from quantune.engine.run.loop import RunStatus
from quantune.engine.run.timebook import time_line
from quantune.engine.trials.selection import quantizes_nothing
from quantune.engine.trials.trial import TrialRecord
from quantune.progress import Step
from quantune.report.heartbeat import PlainProgress
from quantune.report.miss import miss_lines
from quantune.report.result import Result, format_loss, format_ratio
from quantune.report.speed import speed_of
from quantune.report.summarize import node_op_types, quantized_label, summarize_value
from quantune.report.where import target_lines


def _fmt_params(params: dict[str, Any], op_types: dict[str, str] | None = None) -> str:
    """Compact: string values as themselves, true flags by name, false flags left out, long
    lists as a count ("37 nodes excluded: 12 Add, 9 Mul, 16 other"; report/summarize.py)."""
    parts = []
    for name, value in params.items():
        short = name.split(".", 1)[-1]
        summary = summarize_value(short, value, op_types)
        if summary is not None:
            parts.append(summary)
        elif isinstance(value, bool):
            if value:
                parts.append(short)
        elif isinstance(value, str):
            parts.append(value)
        else:
            parts.append(f"{short}={value}")
    return escape(" ".join(parts)) or "(defaults)"  # node names like "[/conv/Conv]" are not markup


def metric_label(metric: str) -> str:
    """A user metric ``path/to/metric.py:function`` is shown by its function's name."""
    return metric.rpartition(":")[2] if ".py:" in metric else metric


class ConsoleListener:
    """Progress of trials and long stages: bars to ``console`` (stderr) on a terminal, plain lines to
    ``lines`` (stdout) otherwise, where a CI log reads them apart from an error's line."""

    def __init__(self, console: Console | None = None, lines: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.lines = lines or Console()
        self._progress: Progress | None = None
        self._task: Any = None
        self._stages: dict[str, Any] = {}  # stage -> its bar
        self._plain: PlainProgress | None = None
        self._began = time.monotonic()
        self._max_trials: int | None = None

    @contextlib.contextmanager
    def showing_stages(self) -> Iterator[None]:
        """The long stages' progress events (:mod:`quantune.progress`) shown while the block runs."""
        self._ready(heartbeat=True)
        try:
            with progress.listening(self._on_step):
                yield
        finally:
            if self._plain is not None:
                self._plain.stop()
            if self._progress is not None:
                self._progress.stop()

    def _ready(self, heartbeat: bool = False) -> None:
        if self._plain is not None or self._progress is not None:
            return
        if not self.console.is_terminal:  # a CI log, a pipe: plain lines, a heartbeat while a stage runs
            self._plain = PlainProgress(
                lambda line: self.lines.print(line, markup=False, highlight=False, soft_wrap=True)
            )
            if heartbeat:
                self._plain.start()
            return
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self._progress.start()

    def _on_step(self, step: Step) -> None:
        if self._plain is not None:
            self._plain(step)
            return
        if self._progress is None:
            return
        bar = self._stages.get(step.stage)
        if step.done == -1:
            if bar is not None:
                self._progress.remove_task(self._stages.pop(step.stage))
        elif bar is None:
            self._stages[step.stage] = self._progress.add_task(
                step.stage.replace("_", " "), total=step.total, completed=max(0, step.done), status=step.unit
            )
        else:
            self._progress.update(bar, total=step.total, completed=step.done, status=step.unit)

    def on_prepared(self, preparation: Any) -> None:
        for line in preparation.steps:
            self.console.print(f"prepared: {escape(line)}")
        for line in preparation.warnings:
            self.console.print(f"[yellow]prepare: {escape(line)}[/yellow]")

    def on_start(self, max_trials: int | None, baseline: dict[str, float]) -> None:
        self._ready()
        self._began = time.monotonic()
        self._max_trials = max_trials
        if self._plain is not None:
            self._plain(Step("tuning", 0, max_trials, 0.0, "trials"))
        if self._progress is not None:
            self._task = self._progress.add_task("tuning", total=max_trials, status="")

    def on_trial(self, record: TrialRecord, status: RunStatus) -> None:
        best = status.best
        best_text = f"best {best.objective:.4g}" if best and best.objective is not None else "no candidate yet"
        text = f"{status.running} running, {status.failed} failed, {best_text}"
        if status.replayed:
            text += f", {status.replayed} resumed"
        if self._plain is not None:
            self._plain(Step("tuning", status.done, self._max_trials, time.monotonic() - self._began, "trials", text))
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=status.done, status=text)

    def on_end(self, result: Result) -> None:
        if self._plain is not None:
            self._plain(Step("tuning", -1, None, time.monotonic() - self._began))
        if self._progress is not None:
            self._progress.stop()


_STOPS = (  # the run's stop reasons (engine/run/loop.py) as a person would say them
    (re.compile(r"max_trials \((\d+)\) reached"), r"the \1-trial limit (stop.max_trials) was reached"),
    (re.compile(r"timeout \(([^)]*)\) reached"), r"the time limit of \1 (stop.timeout_s) was reached"),
    (re.compile(r"search finished \(space exhausted or strategy done\)"), "every setting to try was tried"),
)


def heading(result: Result) -> str:
    """The table's title: the trials counted against ``stop.max_trials`` (those that made an earlier
    trial's model again are not), and why the search stopped."""
    duplicates = sum("(duplicate of trial" in (trial.stage or "") for trial in result.trials)
    counted = len(result.trials) - duplicates
    text = f"quantune: {counted} trial{'' if counted == 1 else 's'}"
    if duplicates:
        text += f" + {duplicates} that made an earlier trial's model again (not counted)"
    reason = result.stop_reason
    for pattern, words in _STOPS:
        reason = pattern.sub(words, reason)
    return f"{text}; stopped: {reason}" if reason else text


def render_result(result: Result, console: Console | None = None, max_rows: int = 40) -> None:
    console = console or Console()
    metric = result.metric
    base = result.baseline
    table = Table(title=escape(heading(result)))
    label = metric_label(metric)
    header = label if len(label) <= 10 else "metric"
    widths = {"#": 4, "params": 16}  # params wraps at words, never cutting a pass name in two
    for column in ("#", "params", header, "loss", "ms", "KB", "ok", "cache"):
        table.add_column(column, overflow="fold", no_wrap=column != "params", min_width=widths.get(column))
    table.add_row(
        "orig",
        "(original model)",
        f"{base[metric]:.4f}",
        "",
        f"{base['latency_ms']:.3f}{'*' if 'latency_search_ms' in base else ''}",
        f"{base['size_bytes'] / 1024:.0f}",
        "",
        "",
    )
    chosen = result.best.number if result.best else None
    op_types = node_op_types((result.preparation or {}).get("model"))
    for record in result.trials[:max_rows]:
        style = "bold green" if record.number == chosen else None
        if record.status != "ok":
            reason = escape((record.failure_class or record.error or "failed")[:80])
            params = f"{_fmt_params(record.params, op_types)}: {reason}"
            table.add_row(str(record.number), params, "failed", *[""] * 5, style="red")
            continue
        m = record.metrics
        retimed = "*" if "latency_search_ms" in m else ""
        hits = sum(1 for outcome in record.cache.values() if outcome == "hit")
        table.add_row(
            str(record.number),
            _fmt_params(record.params, op_types),
            f"{m[metric]:.4f}",
            format_loss(record.accuracy_loss, result.criterion.kind),
            f"{m['latency_ms']:.3f}{retimed}" if "latency_ms" in m else "untimed",
            f"{m['size_bytes'] / 1024:.0f}",
            _ok_label(record),
            f"{hits}/{len(record.cache)}",
            style=style,
        )
    captions = []
    if result.latency_confirmation:
        captions.append("* timed again at the end, side by side with the original (so is 'orig')")
    if any(_ok_label(r) == "copy" for r in result.trials[:max_rows] if r.status == "ok"):
        captions.append("ok 'copy': meets the criterion but quantizes no compute op (the original in disguise)")
    if any(r.untimed for r in result.trials[:max_rows]):
        captions.append(
            "untimed: misses the budget and cannot be the closest miss (its speed cannot change the answer)"
        )
    if len(result.trials) > max_rows:
        captions.append(f"{len(result.trials) - max_rows} more trials in results.json")
    table.caption = "; ".join(captions) or None
    console.print(table)
    console.print(summary(result), markup=False, highlight=False)


def _ok_label(record: TrialRecord) -> str:
    """Meets the criterion: "yes", "no", or "copy" for a model that quantizes nothing."""
    if not record.meets_criterion:
        return "no"
    return "copy" if quantizes_nothing(record) else "yes"  # the original on another provider is no copy


def verdict_line(result: Result) -> str:
    """The run's answer in one line: which model to use, and why."""
    best, base = result.best, result.baseline
    if result.verdict == "improved" and best is not None:
        return f"improved: {result.verdict_reason}"
    if result.verdict == "unconfirmed":
        return f"unconfirmed: {result.verdict_reason}"
    if result.verdict == "keep_original" and best is not None:
        if result.objective == "size":
            words = format_ratio(best.metrics["size_bytes"], base["size_bytes"], less="smaller", more="larger")
            return f"keep the original: no candidate was smaller (best candidate {words}, trial {best.number})"
        if result.objective == "latency":
            words = speed_of(result, best)
            return f"keep the original: no candidate was faster (best candidate {words}, trial {best.number})"
        return f"keep the original: {result.verdict_reason}"
    if result.verdict == "keep_original":  # settled without a candidate (e.g. every variant timed slower)
        return result.verdict_reason
    return (
        f"no candidate in the budget: {result.verdict_reason}"
        if result.verdict_reason
        else "no trial met the criterion."
    )


def memory_line(result: Result) -> str:
    """Peak resident memory: the largest of any trial, and of each stage that ran."""
    peaks = [r.peak_rss_mb for r in result.trials if getattr(r, "peak_rss_mb", None)]
    parts = [f"trials {max(peaks):.0f} MB"] if peaks else []
    parts += [f"{stage.replace('_', ' ')} {mb:.0f} MB" for stage, mb in result.stage_peak_rss_mb.items()]
    return f"peak memory: {', '.join(parts)}" if parts else ""


def summary(result: Result) -> str:
    base = result.baseline
    label = metric_label(result.metric)
    lines = [f"criterion: {label} {result.criterion.describe()}; objective: {result.objective}"]
    lines.append(verdict_line(result))
    if result.best is not None:
        m = result.best.metrics
        lines.append(
            f"best: trial {result.best.number}{_saved_as(result)}  "
            f"{label} {m[result.metric]:.4f} (original {base[result.metric]:.4f}), latency {m['latency_ms']:.3f} ms "
            f"({speed_of(result, result.best)}), "
            f"size {m['size_bytes'] / 1024:.0f} KB "
            f"({format_ratio(m['size_bytes'], base['size_bytes'], less='smaller', more='larger')}), "
            f"quantized ops {quantized_label(m) or 'unknown'}"
        )
        if result.best.session_settings:
            lines.append(session_line(result))
        if result.improved:
            lines.append(f"best model: {result.best_model_path}")
        elif result.unconfirmed_model_path is not None:
            lines.append(f"unconfirmed model (not in best/ until confirmed): {result.unconfirmed_model_path}")
        else:
            lines.append(
                f"the original stays the answer; the candidate's model is in the cache: {result.best.model_path}"
            )
    elif result.closest_miss is not None:
        lines += miss_lines(result, label)
    if result.failure_classes:
        lines.append("failed trials by cause:")
        lines += [f"  {count} x {name}" for name, count in result.failure_classes.items()]
    if result.skipped_known_failures:
        lines.append(f"not run: {result.skipped_known_failures} proposal(s) shared a known failure")
    memory = memory_line(result)
    if memory:
        lines.append(memory)
    lines += target_lines(result)
    for failure in result.stage_errors:
        lines.append(f"stage {failure['stage']} failed: {failure['error']} (the run went on without it)")
    if result.replayed:
        lines.append(f"resumed: {result.replayed} finished trial(s) taken from the run store, not run again")
    if result.interrupted:
        lines.append("interrupted: run the same command again to resume")
    spent = time_line(result.time_spent_s, result.duration_s)
    if spent:
        lines.append(spent)
    lines.append(f"results: {result.output_dir / 'results.json'}  ({result.duration_s:.1f} s)")
    if result.improved and (deploy := deploy_sentence(result.output_dir / "best")):
        lines.append(deploy)  # where and how it was measured, in one sentence
    return "\n".join(lines)


def _saved_as(result: Result) -> str:
    if result.improved:
        return ""
    return " (unconfirmed, in unconfirmed/)" if result.unconfirmed_model_path else " (a candidate only, not saved)"


def session_line(result: Result) -> str:
    settings = ", ".join(f"{key}={value}" for key, value in sorted(result.best.session_settings.items()))
    where = f"{result.best_model_path}.session.json" if result.improved else "its .session.json in the cache"
    return (
        f"session settings (measured with them; set them on onnxruntime.SessionOptions when deploying, "
        f"as Olive's OrtSessionParamsTuning does): {settings} ({where})"
    )
