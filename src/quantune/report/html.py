"""``report.html``: one self-contained, interactive page a person can open offline or send.

Built from the run folder's ``results.json``, so it works for any finished or interrupted run;
plotly.js is inlined once so the page needs no network.
"""

from __future__ import annotations

import contextlib
import functools
import html
import json
import logging
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from string import Template
from typing import Any

from quantune.engine.outcome.result import Result
from quantune.engine.run.interrupts import raise_if_stopped
from quantune.errors import QuantuneError
from quantune.store.faults import storage_errors

log = logging.getLogger("quantune")
_TEMPLATE = Path(__file__).with_name("template.html")
# The fewest finished trials the parameter views are drawn for: fewer say nothing, and drawing takes seconds.
VIEW_TRIALS = 5


def write_report(run_dir: str | Path, output: str | Path | None = None, *, parameter_views: bool = True) -> Path:
    """Writes ``report.html`` (and ``optuna.journal``) for the run in ``run_dir`` and returns its path;
    ``parameter_views=False`` leaves out the Optuna views, most of the drawing's seconds."""
    run_dir = Path(run_dir)
    path = run_dir / "results.json"
    try:
        results = json.loads(path.read_text())
    except FileNotFoundError:
        raise QuantuneError(f"report: no results.json in '{run_dir}' (give the --output folder of a run)") from None
    except ValueError as exc:
        raise QuantuneError(f"report: '{path}' is not valid JSON ({exc})") from None
    if not isinstance(results, dict) or not {"trials", "baseline", "criterion"} <= set(results):
        raise QuantuneError(f"report: '{path}' is not a quantune results.json (no 'trials', 'baseline' or 'criterion')")
    try:
        result = Result.from_json(results, run_dir)  # the typed view every section reads
    except (KeyError, TypeError, ValueError) as exc:
        raise QuantuneError(f"report: '{path}' is not a results.json quantune can read ({exc!r} in it)") from None
    target = Path(output) if output is not None else run_dir / "report.html"
    field = "report --output" if output is not None else "report"
    if target.is_dir():
        raise QuantuneError(f"{field}: '{target}' is a folder; name the file to write, e.g. '{target / 'report.html'}'")
    page = render_html(result, run_dir, page_dir=target.parent, parameter_views=parameter_views)
    try:
        with storage_errors(target, field):
            target.parent.mkdir(parents=True, exist_ok=True)  # a new folder for the page is made
            tmp = target.with_name(f".{target.name}.tmp")
            try:
                tmp.write_text(page, encoding="utf-8")
                os.replace(tmp, target)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
    except OSError as exc:  # e.g. a file where a parent folder should be
        raise QuantuneError(f"{field}: cannot write '{target}' ({exc.strerror or exc})") from None
    return target


def render_html(
    results: Result | Mapping[str, Any],
    run_dir: str | Path | None = None,
    page_dir: str | Path | None = None,
    parameter_views: bool = True,
) -> str:
    """The page for one run's :class:`Result` (or results.json); ``run_dir`` holds its models and config."""
    from plotly.offline import get_plotlyjs

    from quantune.report import plots, sections
    from quantune.report.precision import precision_bars
    from quantune.report.study import objective_name
    from quantune.report.summarize import node_op_types
    from quantune.report.table import trial_table

    run_dir = Path(run_dir) if run_dir is not None else Path(".")
    page_dir = Path(page_dir) if page_dir is not None else run_dir
    if not isinstance(results, Result):
        results = Result.from_json(results, run_dir)
    chosen_path, _, chosen_kind = sections.chosen_model(results, run_dir)
    start = (results.preparation or {}).get("model")
    types = {**node_op_types(chosen_path), **node_op_types(start)}
    precision, counts = sections.precision_section(results, run_dir, types)
    views, note = _optuna_views(results, run_dir) if parameter_views else _views_left_out(run_dir)
    fields = {
        "title": html.escape(f"quantune: {results.metric}, {len(results.trials)} trials"),
        "plotlyjs": get_plotlyjs(),
        "verdict": sections.verdict(results),
        "summary": sections.summary(results),
        "trade_off": _figure("trade-off", lambda: plots.trade_off(results)),
        "progress": _figure("progress", lambda: plots.progress(results)),
        "pareto": _figure("pareto", lambda: plots.pareto(results)),
        "study_note": html.escape(note),
        "objective": html.escape(objective_name(results)),
        "chosen_kind": html.escape(chosen_kind or "chosen model"),
        "precision": precision,
        "precision_plot": _figure("precision", lambda: precision_bars(counts)) if counts else "",
        "recovery": sections.recovery_section(results),
        "table": trial_table(results, page_dir, types),
        "environment": sections.environment(results),
        **views,
    }
    raise_if_stopped()  # a signal a view's drawing caught as an error: no page, the run stops
    return Template(_TEMPLATE.read_text(encoding="utf-8")).substitute(fields)


def _figure(name: str, build: Callable[[], Any]) -> str:
    """A plotly figure as a ``<div>`` (plotly.js is inlined once in the page head), or why not."""
    try:
        figure = build()
    except Exception as exc:  # one view that cannot be drawn leaves the rest of the page
        log.debug("report: %s not drawn", name, exc_info=True)
        return f"<p class=note>The {html.escape(name)} view could not be drawn: {html.escape(_reason(exc))}</p>"
    import plotly.io as pio

    spec = figure.to_dict()  # plain JSON (report/spec.py), its theme added here as JSON too
    spec["layout"]["template"] = white_template()
    return pio.to_html(
        spec,
        validate=False,
        full_html=False,
        include_plotlyjs=False,
        div_id=f"plot-{name}",
        config={"displaylogo": False, "responsive": True},
    )


@functools.cache
def white_template() -> dict[str, Any]:
    """plotly's ``plotly_white`` theme as its JSON, without plotly's validation."""
    import pkgutil

    with contextlib.suppress(OSError, ValueError, TypeError):
        raw = pkgutil.get_data("plotly", "package_data/templates/plotly_white.json")
        if raw:
            return json.loads(raw)
    import plotly.io as pio

    return pio.templates["plotly_white"].to_plotly_json()


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


VIEW_NAMES = [f"{kind}_{target}" for kind in ("importance", "parallel", "slice") for target in ("objective", "loss")]


def _no_views(text: str) -> dict[str, str]:
    return dict.fromkeys(VIEW_NAMES, f"<p class=note>{html.escape(text)}</p>")


def _optuna_views(results: Result, run_dir: Path) -> tuple[dict[str, str], str]:
    """Importance, parallel-coordinate and slice plots from ``optuna.visualization`` on the run's study."""
    from quantune.report.plots import loss_scale
    from quantune.report.study import STUDY_FILE, STUDY_NAME, objective_name, run_space, write_study

    finished = [t for t in results.trials if t.status == "ok" and t.accuracy_loss is not None]
    if len(finished) < 2:  # nothing to view, and importing Optuna's plots costs time
        why = "fewer than two finished trials"
        return _no_views(f"No parameter view: {why}."), f"No Optuna study written ({why})."
    try:
        study = write_study(results, run_dir, run_space(run_dir))
    except Exception as exc:
        note = f"The run could not be written as an Optuna study ({_reason(exc)})."
        return _no_views(note), note
    where = (run_dir / STUDY_FILE).resolve()
    if len(finished) < VIEW_TRIALS:
        why = f"fewer than {VIEW_TRIALS} finished trials"
        note = f"{len(study.trials)} trials as an Optuna study ('{STUDY_NAME}' in {where}; no parameter views: {why})."
        return _no_views(f"No parameter view: {why}."), note
    try:
        import optuna.visualization  # noqa: F401 (plotly missing fails here, with the note below)
    except Exception as exc:
        note = f"Optuna's views cannot be drawn here ({_reason(exc)})."
        return _no_views(note), note
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    scale, loss_label = loss_scale(results)
    targets = {
        "objective": ((lambda t: t.values[0]), objective_name(results)),
        "loss": ((lambda t: scale * t.values[1]), loss_label),
    }
    chosen = results.best or results.closest_miss
    params, among = view_params(study, chosen.number if chosen is not None else None)
    if len(complete) < 2 or not params:
        why = "fewer than two finished trials" if len(complete) < 2 else "no searched parameter took two values"
        note = f"{len(study.trials)} trials as an Optuna study ({why})."
        return _no_views(f"No parameter view: {why} in the chosen trial's flow."), note
    with warnings.catch_warnings():
        # Optuna's notes to its own users (experimental APIs, PED-ANOVA's targets) are not ours to show
        warnings.simplefilter("ignore", UserWarning)
        views = _views(study, params, targets)
    note = (
        f"{len(complete)} finished and {len(study.trials) - len(complete)} failed trials as an Optuna study; the views "
        f"show the {len(params)} parameter(s) that varied among the {among} finished trials that share the chosen "
        f"trial's parameters "
        f"('{STUDY_NAME}' in {where}; open it with optuna-dashboard {where}). "
        f"The views are drawn from {VIEW_TRIALS} finished trials, importance over those whose searched parameters "
        "differ; a conditional parameter is named by its parents' values, as the Optuna samplers name it."
    )
    return views, note


def _views_left_out(run_dir: Path) -> tuple[dict[str, str], str]:
    """The parameter views' places when they were left out to keep ``stop.timeout_s``."""
    note = (
        "The parameter views were left out to end within stop.timeout_s (drawing them takes seconds); "
        f"quantune report {run_dir} draws the page with them."
    )
    return _no_views(note), note


def view_params(study: Any, chosen: int | None) -> tuple[list[str], int]:
    """The parameters the views show and how many trials they cover: the chosen trial's (else the
    most common set) that took at least two values, since Optuna's views need every shown parameter."""
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    if not complete:
        return [], 0
    chosen_trial = next((t for t in complete if t.user_attrs.get("quantune_trial") == chosen), None)
    if chosen_trial is not None:
        names = list(chosen_trial.params)
    else:
        names = list(max(complete, key=lambda t: sum(set(o.params) == set(t.params) for o in complete)).params)
    same = [t for t in complete if set(names) <= set(t.params)]
    varied = [n for n in names if len({repr(t.params[n]) for t in same}) > 1]
    return varied, len(same)


def _views(study: Any, params: list[str], targets: dict[str, Any]) -> dict[str, str]:
    import optuna.visualization as vis

    evaluator = _evaluator()
    views = {}
    for target, (value, label) in targets.items():
        views[f"importance_{target}"] = _figure(
            f"importance-{target}",
            lambda v=value, lab=label: _titled(
                vis.plot_param_importances(study, evaluator=evaluator, params=params, target=v, target_name=lab),
                f"parameter importance for {lab}",
            ),
        )
        views[f"parallel_{target}"] = _figure(
            f"parallel-{target}",
            lambda v=value, lab=label: _titled(
                vis.plot_parallel_coordinate(study, params=params, target=v, target_name=lab), ""
            ),
        )
        views[f"slice_{target}"] = _figure(
            f"slice-{target}",
            lambda v=value, lab=label: _titled(vis.plot_slice(study, params=params, target=v, target_name=lab), ""),
        )
    return views


def _evaluator() -> Any:
    """fANOVA (Optuna's default) when scikit-learn is installed, else PED-ANOVA (no extra package)."""
    import importlib.util

    from optuna.importance import FanovaImportanceEvaluator, PedAnovaImportanceEvaluator

    if importlib.util.find_spec("sklearn") is not None:
        return FanovaImportanceEvaluator(seed=0)
    return PedAnovaImportanceEvaluator()


def _titled(figure: Any, title: str) -> Any:
    from quantune.report.plots import styled

    if title:
        figure.update_layout(title=title)
    height = figure.layout.height or 420
    figure.update_layout(width=None, autosize=True)  # fit the page, not Optuna's 300 px per slice
    return styled(figure, height=max(380, min(int(height), 700)))
