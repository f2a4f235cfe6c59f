"""Measures result models each on its own runtime: accuracy, size and interleaved latency.

    python bench/timing.py JOB.json OUT.json    # in the venv that has every runtime the job names

Rows run on onnxruntime's CPU provider, except those a tool scored on another runtime (NNCF's
OpenVINO IR: ``{"name": "openvino", ...}``, see ``common.open_model``). The harness's own venv
has no OpenVINO, so a case with such a row is measured by this script run with the python of
the runtime's venv (``venv-nncf`` has onnxruntime and openvino): every model of the case, the
fp32 original on the CPU provider included, is timed there in the same interleaved rounds of
one process, each on its own runtime with one thread. A case whose rows are all onnxruntime is
measured in the harness's process, as before (``run.py`` imports :func:`measure_models`).

JOB: ``{"spec": <case file>, "models": {name: [path, runtime or null]}, "accuracy": [names],
"warmup": n, "repeats": n, "interleaved": bool}``; OUT: ``{name: {metric, latency_ms, ...}}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import batches, latency_interleaved, latency_ms, load_data, load_metric, run_model, view

# the venv (under the bench cache) whose python has each runtime besides onnxruntime
RUNTIME_VENVS = {"openvino": "venv-nncf"}


def model_size(model: Path) -> int:
    """The model file plus its external data (``*.data``) or OpenVINO weights (``<stem>.bin``)."""
    extra = list(model.parent.glob("*.data"))
    if model.suffix == ".xml" and model.with_suffix(".bin").exists():
        extra.append(model.with_suffix(".bin"))
    return model.stat().st_size + sum(p.stat().st_size for p in extra)


def measure_models(job: dict) -> dict[str, dict]:
    """Accuracy and size of ``job["accuracy"]``'s models; latency of every model (interleaved
    rounds when ``job["interleaved"]``, else each on its own as a row is first measured)."""
    spec = job["spec"]
    data = load_data(spec["evaluation"])
    models = {name: (Path(path), runtime) for name, (path, runtime) in job["models"].items()}
    figures: dict[str, dict] = {name: {} for name in models}
    metric = load_metric(spec["metric"], spec.get("label_key", "label")) if job.get("accuracy") else None
    for name in job.get("accuracy", []):
        path, runtime = models[name]
        outputs = run_model(path, data, spec["batch_size"], runtime)
        figures[name].update(metric=float(metric(outputs, view(data))), size_bytes=model_size(path))
    feeds = next(batches(data, spec["input_names"], spec["batch_size"]))
    warmup, repeats = job["warmup"], job["repeats"]
    if job.get("interleaved"):
        for name, timed in latency_interleaved(models, feeds, warmup=warmup, repeats=repeats).items():
            figures[name].update(timed)
    else:
        for name, (path, runtime) in models.items():
            figures[name].update(latency_ms(path, feeds, warmup=warmup, repeats=repeats, runtime=runtime))
    return figures


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(measure_models(job)))


if __name__ == "__main__":
    main()
