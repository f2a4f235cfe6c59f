"""What a person sees in the terminal: a progress bar while trials run, then a table."""

from __future__ import annotations

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

from quantune.engine.engine import RunStatus
from quantune.engine.trial import TrialRecord
from quantune.report.result import Result, format_loss


def _fmt_params(params: dict[str, Any]) -> str:
    """Compact: string values as themselves, true flags by name, false flags left out."""
    parts = []
    for name, value in params.items():
        short = name.split(".", 1)[-1]
        if isinstance(value, bool):
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
    """Progress bar: trials done / running / failed, best so far, elapsed and time left."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self._progress: Progress | None = None
        self._task: Any = None

    def on_start(self, max_trials: int | None, baseline: dict[str, float]) -> None:
        self._progress = Progress(
            TextColumn("[bold]tuning"),
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
        self._task = self._progress.add_task("trials", total=max_trials, status="")

    def on_trial(self, record: TrialRecord, status: RunStatus) -> None:
        best = status.best
        best_text = f"best {best.objective:.4g}" if best and best.objective is not None else "no candidate yet"
        text = f"{status.running} running, {status.failed} failed, {best_text}"
        if status.replayed:
            text += f", {status.replayed} resumed"
        if self._progress is not None:
            self._progress.update(self._task, completed=status.done, status=text)

    def on_end(self, result: Result) -> None:
        if self._progress is not None:
            self._progress.stop()


def render_result(result: Result, console: Console | None = None, max_rows: int = 40) -> None:
    """The final table (one row per trial) and a summary of the best model."""
    console = console or Console()
    metric = result.metric
    base = result.baseline
    table = Table(title=f"quantune: {len(result.trials)} trials ({result.stop_reason})")
    for column in ("#", "params", metric_label(metric), "loss", "ms", "KB", "ok", "cache"):
        table.add_column(column, overflow="fold", no_wrap=column != "params", min_width=4 if column == "#" else None)
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
    for record in result.trials[:max_rows]:
        style = "bold green" if record.number == chosen else None
        if record.status != "ok":
            reason = escape((record.error or "failed")[:80])
            table.add_row(
                str(record.number), f"{_fmt_params(record.params)}: {reason}", "failed", "", "", "", "", "", style="red"
            )
            continue
        m = record.metrics
        retimed = "*" if "latency_search_ms" in m else ""
        hits = sum(1 for outcome in record.cache.values() if outcome == "hit")
        table.add_row(
            str(record.number),
            _fmt_params(record.params),
            f"{m[metric]:.4f}",
            format_loss(record.accuracy_loss, result.criterion["type"]),
            f"{m['latency_ms']:.3f}{retimed}",
            f"{m['size_bytes'] / 1024:.0f}",
            "yes" if record.meets_criterion else "no",
            f"{hits}/{len(record.cache)}",
            style=style,
        )
    captions = []
    if result.latency_confirmation:
        captions.append("* timed again at the end, side by side with the original (so is 'orig')")
    if len(result.trials) > max_rows:
        captions.append(f"{len(result.trials) - max_rows} more trials in results.json")
    table.caption = "; ".join(captions) or None
    console.print(table)
    console.print(summary(result), markup=False, highlight=False)


def memory_line(result: Result) -> str:
    """Peak resident memory: the largest of any trial, and of each stage that ran."""
    peaks = [r.peak_rss_mb for r in result.trials if getattr(r, "peak_rss_mb", None)]
    parts = [f"trials {max(peaks):.0f} MB"] if peaks else []
    parts += [f"{stage.replace('_', ' ')} {mb:.0f} MB" for stage, mb in result.stage_peak_rss_mb.items()]
    return f"peak memory: {', '.join(parts)}" if parts else ""


def summary(result: Result) -> str:
    base = result.baseline
    label = metric_label(result.metric)
    lines = [f"criterion: {label} {result.criterion['description']}; objective: {result.objective}"]
    if result.best is not None:
        m = result.best.metrics
        lines.append(
            f"best: trial {result.best.number}  {label} {m[result.metric]:.4f} "
            f"(original {base[result.metric]:.4f}), latency {m['latency_ms']:.3f} ms "
            f"({base['latency_ms'] / m['latency_ms']:.2f}x faster), size {m['size_bytes'] / 1024:.0f} KB "
            f"({base['size_bytes'] / m['size_bytes']:.2f}x smaller)"
        )
        lines.append(f"best model: {result.best_model_path}")
    else:
        lines.append("no trial met the criterion.")
        if result.closest_miss is not None:
            miss = result.closest_miss
            lines.append(
                f"closest miss: trial {miss.number}, {label} {miss.metrics[result.metric]:.4f} "
                f"(loss {format_loss(miss.accuracy_loss, result.criterion['type'])}); saved in {result.output_dir / 'closest_miss'}"
            )
    memory = memory_line(result)
    if memory:
        lines.append(memory)
    for failure in result.stage_errors:
        lines.append(f"stage {failure['stage']} failed: {failure['error']} (the run went on without it)")
    if result.replayed:
        lines.append(f"resumed: {result.replayed} finished trial(s) taken from the run store, not run again")
    if result.interrupted:
        lines.append("interrupted: run the same command again to resume")
    lines.append(f"results: {result.output_dir / 'results.json'}  ({result.duration_s:.1f} s)")
    return "\n".join(lines)
