"""The Python API: ``quantune.tune(config) -> Result``, ``quantune.check(config)``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantune.errors import QuantuneError
from quantune.forkserver import refuse_in_starting_worker, warm_up, will_fork

if TYPE_CHECKING:  # the config and the engine are imported once the fork server is started (tune)
    from quantune.config import Config, LoadedConfig
    from quantune.engine import RunListener
    from quantune.report import Result


def tune(
    config: str | Path | dict[str, Any] | Config | LoadedConfig,
    output: str | Path | None = None,
    *,
    restart: bool = False,
    listeners: list[RunListener] | None = None,
    workers: int | None = None,
    executor: str | None = None,
    overrides: dict[str, Any] | None = None,
    started: float | None = None,
) -> Result:
    """Searches the config's space and returns the result; files go to ``output``.

    ``config`` is a YAML/JSON path, a dict, or a :class:`~quantune.config.Config`. The default
    output folder is ``runs/<config file name>`` in the working directory; a folder holding an
    interrupted run of the same config is resumed. ``workers`` and ``executor`` override the
    config's ``executor`` section. ``overrides`` sets fields of the config before it is validated,
    by dotted path (``{"stop.max_trials": 5, "search.sampler": "random"}``); a file's relative
    paths stay relative to the file. ``started``: the ``time.perf_counter()`` reading
    ``stop.timeout_s`` counts from (the CLI passes its process's start); by default, now.

    >>> result = quantune.tune("examples/digits/config.yaml")  # doctest: +SKIP
    >>> result.best.metrics["latency_ms"], result.best_model_path  # doctest: +SKIP
    """
    refuse_in_starting_worker()
    if will_fork(config, executor, overrides):
        # the fork server imports the heavy modules while this process validates the config
        warm_up()
    from pydantic import ValidationError

    from quantune.config import load_config
    from quantune.config.loader import format_validation_error

    loaded: LoadedConfig = load_config(config, overrides)
    executor_overrides: dict[str, Any] = {}
    if workers is not None:
        executor_overrides["workers"] = workers
    if executor is not None:
        executor_overrides["kind"] = executor
    if executor_overrides:  # validated like the config's own executor section (model_copy would not check)
        section = type(loaded.config.executor)
        try:
            new_executor = section.model_validate({**loaded.config.executor.model_dump(), **executor_overrides})
        except ValidationError as exc:
            raise QuantuneError(format_validation_error(exc, prefix="executor")) from None
        loaded = replace(loaded, config=loaded.config.model_copy(update={"executor": new_executor}))
    if output is None:
        name = Path(loaded.source).stem if loaded.source != "config" else "quantune"
        output = Path("runs") / name
    if loaded.config.executor.kind == "process":
        warm_up()  # a no-op when the hint above started it
    from quantune.engine import Engine
    from quantune.report.result import PageWriter

    # the engine writes results.json and best/; the report draws report.html from them at the end
    listeners = [*(listeners or []), PageWriter()]
    return Engine(loaded, Path(output), restart=restart, listeners=listeners, started=started).run()


def check(
    config: str | Path | dict[str, Any] | Config | LoadedConfig, overrides: dict[str, Any] | None = None
) -> dict[str, float]:
    """The preflight alone: the config, its data checked against the model, and the original evaluated.
    Returns the original's figures; a mistake raises :class:`~quantune.errors.QuantuneError` naming
    the file or field. ``overrides`` as for :func:`tune`."""
    from quantune.engine.trials.limits import check_watchdog
    from quantune.engine.trials.setup import build_run, preflight

    refuse_in_starting_worker()
    from quantune.config import load_config

    loaded = load_config(config, overrides)
    with check_watchdog(loaded.config):  # the loader and the metric run here: never for ever
        return preflight(build_run(loaded))
