"""The sensitivity probe a strategy calls: the flow's passes through the artifact cache (the trials' keys), then a
measurement in a worker: static quantization forced to QDQ (the same numbers, every tensor visible), dynamic from the
float model alone."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantune.data import Dataset
from quantune.evaluate.sensitivity.dynamic import measure_dynamic
from quantune.evaluate.sensitivity.provider import RunOutputs, measure_on_provider
from quantune.evaluate.sensitivity.static import measure
from quantune.evaluate.sensitivity.stats import SensitivityReport
from quantune.memory import note_stage_peak, peak_tracker
from quantune.passes import PassConfig
from quantune.passes.cached import run_flow_cached
from quantune.store import ArtifactCache, cache_key

log = logging.getLogger("quantune.sensitivity")

VERSION = 10  # 10: rows bounded by row_runs; 9: float32 elementwise, float64 sums (NodeStats.add); 4: per-sample error counts too (NodeStats.nmse); 5: the head measured at the outputs; 6: amplified nodes too; 7: measured in batches of up to MEASURE_BATCH rows; 8: the lead-in measured at the outputs

CPU = "CPUExecutionProvider"  # the provider the in-process measurement runs on
StepConfigs = Callable[[Mapping[str, Any], tuple[str, ...]], list[tuple[Any, PassConfig]]]


@dataclass(frozen=True)
class ProbeJob:
    """One sensitivity measurement as plain data, so it can run in a worker process."""

    model_path: Path
    model_sha: str
    steps: list[tuple[str, type, PassConfig]]  # (step id, pass class, config) up to the quant step
    quant_step: str
    calibration: Dataset
    input_names: list[str]
    batch_size: int
    cache_root: Path
    rows: int
    dynamic: bool
    row_runs: float | None = (
        None  # the measurement's bound in whole-model runs of one row (evaluate/sensitivity/cost.py)
    )


def _float_model(job: ProbeJob, cache: ArtifactCache) -> tuple[Callable[..., tuple[Path, str]], Any, Path, str]:
    """(a cached runner of flow steps, the quant step as (id, pass class, config), its float model and hash)."""
    index = [step_id for step_id, _, _ in job.steps].index(job.quant_step)

    def run(steps: list[tuple[str, type, PassConfig]], model: Path, sha: str) -> tuple[Path, str]:
        return run_flow_cached(
            cache,
            steps,
            model,
            sha,
            calibration=job.calibration,
            input_names=job.input_names,
            batch_size=job.batch_size,
            label_suffix=" (sensitivity)",
        )

    return run, job.steps[index], *run(job.steps[:index], job.model_path, job.model_sha)


def _qdq(config: PassConfig, pass_cls: type) -> PassConfig:
    """``config`` forced to QDQ: the same numbers as QOperator, but every tensor stays visible."""
    knobs = pass_cls.knobs
    dumped = config.model_dump()
    return type(config).model_validate({**dumped, **({knobs.layout: knobs.qdq} if knobs.layout else {})})


def run_probe(job: ProbeJob, cache: ArtifactCache | None = None) -> dict[str, Any]:
    """The :class:`SensitivityReport` of ``job`` as JSON data (through the artifact cache)."""
    cache = cache or ArtifactCache(job.cache_root)
    run, (step_id, pass_cls, config), float_path, float_sha = _float_model(job, cache)

    def batches():
        return job.calibration.batches(job.input_names, job.batch_size, job.rows)

    knobs, dumped = pass_cls.knobs, config.model_dump()
    if job.dynamic:
        # the weights as the pass quantizes them (its knobs; the cache key holds its own names)
        options = {name: dumped[name] for name in (knobs.weights, knobs.per_channel, knobs.narrow) if name in dumped}
        key = cache_key(
            "sensitivity-dynamic", VERSION, float_sha, options, job.calibration.fingerprint, job.rows, job.row_runs
        )
        cached = cache.get_json("sensitivity", key)
        if cached is not None:
            return cached
        with peak_tracker() as peak:
            report = measure_dynamic(
                float_path,
                batches,
                weight_type=str(options.get(knobs.weights, "int8")),
                per_channel=bool(options.get(knobs.per_channel, False)),
                reduce_range=bool(options.get(knobs.narrow, False)),
                row_runs=job.row_runs,
            )
    else:
        quant_path, quant_sha = run([(step_id, pass_cls, _qdq(config, pass_cls))], float_path, float_sha)
        key = cache_key(
            "sensitivity", VERSION, float_sha, quant_sha, job.calibration.fingerprint, job.rows, job.row_runs
        )
        cached = cache.get_json("sensitivity", key)
        if cached is not None:
            return cached
        wide = measure_batch(float_path, job.batch_size)
        with peak_tracker() as peak:
            try:
                report = measure(
                    float_path,
                    quant_path,
                    lambda: job.calibration.batches(job.input_names, wide, job.rows),
                    row_runs=job.row_runs,
                )
            except Exception as exc:  # a "dynamic" batch axis the graph does not honour (a fixed Reshape)
                if wide == job.batch_size:
                    raise
                log.info(
                    "sensitivity in batches of %d failed (%s); measuring in batches of %d", wide, exc, job.batch_size
                )
                report = measure(float_path, quant_path, batches, row_runs=job.row_runs)
    note_stage_peak("sensitivity_measure", peak.mb)
    data = report.to_json()
    cache.put_json("sensitivity", key, data)
    return data


def run_provider_probe(
    job: ProbeJob, cache: ArtifactCache, provider: str, fingerprint: Any, run_outputs: RunOutputs
) -> dict[str, float]:
    """Each node's score as ``provider`` runs ``job``'s static quantization, cached per provider and backend."""
    run, (step_id, pass_cls, config), float_path, float_sha = _float_model(job, cache)
    quant_path, quant_sha = run([(step_id, pass_cls, _qdq(config, pass_cls))], float_path, float_sha)
    key = cache_key(
        "sensitivity-provider",
        VERSION,
        provider,
        fingerprint,
        float_sha,
        quant_sha,
        job.calibration.fingerprint,
        job.rows,
    )
    cached = cache.get_json("sensitivity", key)
    if cached is not None:
        return cached
    feeds = list(job.calibration.batches(job.input_names, job.batch_size, job.rows))
    with tempfile.TemporaryDirectory(prefix="quantune-provider-sensitivity-") as folder:
        scores = measure_on_provider(float_path, quant_path, feeds, run_outputs, Path(folder))
    cache.put_json("sensitivity", key, scores)
    return scores


# The measurement's budget, in evaluations of the original (evaluate/sensitivity/cost.py); its sessions run unfused, so
# a counted run takes about twice an optimized one.
EVALUATIONS = 1.0
MEASURE_BATCH = 8  # rows per run of the measurement, where the model's batch axis is free


def measure_batch(model_path: Path, batch_size: int) -> int:
    """Rows per batch for the static measurement: ``MEASURE_BATCH`` for symbolic first axes, else ``batch_size``."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    inits = {init.name for init in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    free = bool(inputs) and all(
        i.type.HasField("tensor_type")
        and len(i.type.tensor_type.shape.dim) > 0
        and not i.type.tensor_type.shape.dim[0].HasField("dim_value")
        for i in inputs
    )
    return max(batch_size, MEASURE_BATCH) if free else batch_size


@dataclass
class SensitivityProbe:
    """``probe(point)`` -> node scores for the flow's quantization at ``point`` (the last report in ``last``). With
    ``isolation`` in a worker: one that dies gives no scores, and no later point is probed."""

    model_path: Path
    model_sha: str
    flow: tuple[str, ...]
    quant_step: str
    configs_for: StepConfigs
    calibration: Dataset
    input_names: list[str]
    batch_size: int
    cache: ArtifactCache
    rows: int = 128
    last: SensitivityReport | None = None
    calls: int = 0
    dynamic: bool = False  # the quant step is dynamic_quant: scored by :func:`measure_dynamic`
    isolation: Any = None  # quantune.engine.executors.stage.Isolation, or None: in this process
    failed: str | None = None  # why an isolated measurement failed; no scores after that
    eval_rows: int | None = None  # rows of the evaluation data: the measurement's time is set by them

    def __call__(self, point: Mapping[str, Any]) -> dict[str, float]:
        return dict(self.report(point).scores)

    def on_provider(self, point: Mapping[str, Any], provider: str, backend: Any, threads: int) -> dict[str, float]:
        """Node scores as ``provider`` runs the quantized model; where that fails (or dynamic), the CPU's ranking."""
        if provider == CPU or self.dynamic:
            return self(point)

        def run(model: Path, feeds: list[dict[str, Any]]) -> list[Mapping[str, Any]]:
            return backend.outputs(model, feeds, threads=threads, runner=None, settings={"provider": provider})

        self.calls += 1
        try:
            return run_provider_probe(self._job(point), self.cache, provider, backend.fingerprint(), run)
        except Exception as exc:
            log.warning("sensitivity on %s failed (%s); ranked as the CPU provider runs the model", provider, exc)
            return self(point)

    def report(self, point: Mapping[str, Any]) -> SensitivityReport:
        self.calls += 1
        if self.failed is not None:
            return SensitivityReport(scores={})
        job = self._job(point)
        if self.isolation is None:
            data = run_probe(job, self.cache)
        else:
            from quantune.engine.executors.stage import run_stage  # the worker machinery, on first isolated probe

            outcome = run_stage("sensitivity", run_probe, job, isolation=self.isolation)
            if not outcome.ok:
                self.failed = outcome.error
                log.warning("sensitivity analysis failed (%s); groups are ranked in graph order", outcome.error)
                self.last = SensitivityReport(scores={})
                return self.last
            data = outcome.value
        self.last = SensitivityReport.from_json(data)
        return self.last

    def _job(self, point: Mapping[str, Any]) -> ProbeJob:
        steps = self.flow[: self.flow.index(self.quant_step) + 1]
        return ProbeJob(
            model_path=self.model_path,
            model_sha=self.model_sha,
            steps=[(step.id, step.pass_cls, config) for step, config in self.configs_for(point, steps)],
            quant_step=self.quant_step,
            calibration=self.calibration,
            input_names=list(self.input_names),
            batch_size=self.batch_size,
            cache_root=self.cache.root,
            rows=self.rows,
            dynamic=self.dynamic,
            row_runs=None if not self.eval_rows else EVALUATIONS * self.eval_rows,
        )
