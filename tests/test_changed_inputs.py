"""Inputs that are not what a run can use, or that change under it: a model file replaced while
trials run, a metric that returns no number, a model quantized already, a cache folder inside
the output folder, a model whose external-data file is missing. Each is one line naming the
file or field (exit 2) or, for the cache, simply works; never a wrong result."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_dynamic, quantize_static

import quantune
from quantune.cli import main
from quantune.errors import QuantuneError
from quantune.model import ModelHandle
from quantune.store import RunStore


def write_config(tmp_path: Path, config: dict[str, Any]) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def one_line(code: int, err: str, *needles: str) -> str:
    assert code == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quantune: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def other_weights(model: Path, target: Path) -> None:
    """``model`` with every float weight scaled: the same graph, other content."""
    proto = onnx.load(str(model))
    for init in proto.graph.initializer:
        array = onnx.numpy_helper.to_array(init)
        if array.dtype == np.float32:
            init.CopyFrom(onnx.numpy_helper.from_array(array * -3.0, init.name))
    onnx.save(proto, str(target))


# -- a model file replaced while the run goes on -----------------------------------------------------


class ReplacesTheModel:
    """Copies another model over the run's model file once the first trial is recorded."""

    def __init__(self, model: Path, replacement: Path, cache: Path) -> None:
        self.model, self.replacement, self.cache = model, replacement, cache
        self.cached_then: set[str] | None = None

    def on_start(self, max_trials, baseline) -> None:
        pass

    def on_trial(self, record, status) -> None:
        if self.cached_then is None:
            shutil.copyfile(self.replacement, self.model)
            self.cached_then = {p.name for p in (self.cache / "models").iterdir()}

    def on_end(self, result) -> None:
        pass


@pytest.mark.parametrize("kind", ["inline", "process"])
def test_a_model_replaced_during_the_run_stops_it_and_is_never_built_from(make_config, cnn_model, tmp_path, kind):
    """Trials read the user's file (``prepare: off``): once it is replaced, no trial is built
    from it, nothing is cached from it, the finished trial is kept, and the run stops naming it."""
    replacement = tmp_path / "replacement.onnx"
    other_weights(cnn_model, replacement)
    config = make_config(prepare="off", executor={"kind": kind, "workers": 1})
    swap = ReplacesTheModel(cnn_model, replacement, tmp_path / "cache")
    with pytest.raises(QuantuneError) as raised:
        quantune.tune(config, output=tmp_path / "out", listeners=[swap])
    message = str(raised.value)
    assert "model (" in message and cnn_model.name in message and "changed while this run" in message, message
    store = RunStore(tmp_path / "out" / "run.db")
    kept = store.trials()
    store.close()
    assert [t["status"] for t in kept] == ["ok"], "the trial finished before the change is kept, no later one"
    assert swap.cached_then is not None
    assert {p.name for p in (tmp_path / "cache" / "models").iterdir()} == swap.cached_then, "nothing built from it"


def test_the_cli_says_a_replaced_model_in_one_line(make_config, cnn_model, tmp_path, capsys):
    """The metric replaces the model on its second call (the first trial's evaluation; the first
    scores the original): the run ends with one line naming the file, exit 2."""
    other_weights(cnn_model, tmp_path / "replacement.onnx")
    script = tmp_path / "metric.py"
    script.write_text(
        "import shutil\nfrom pathlib import Path\nimport numpy as np\n\n"
        "def score(outputs, data):\n"
        "    calls = Path(__file__).with_name('calls.txt')\n"
        "    calls.write_text(calls.read_text() + 'x' if calls.exists() else 'x')\n"
        "    if calls.read_text() == 'xx':\n"
        f"        shutil.copyfile({str(tmp_path / 'replacement.onnx')!r}, {str(cnn_model)!r})\n"
        "    return float(np.mean(np.argmax(next(iter(outputs.values())), axis=1) == data['label']))\n"
    )
    config = make_config(
        prepare="off", evaluation={"metric": f"{script}:score", "latency": {"warmup": 0, "repeats": 2}}
    )
    code = main(["run", str(write_config(tmp_path, config)), "-q", "-o", str(tmp_path / "out")])
    one_line(code, capsys.readouterr().err, "model (", cnn_model.name, "changed while this run")
    assert (tmp_path / "calls.txt").read_text() == "xx", "no trial after the change was evaluated"


def test_a_model_hash_is_taken_again_only_when_its_file_changed(cnn_model, tmp_path):
    handle = ModelHandle.from_path(cnn_model)
    first = handle.sha256
    assert handle.current_sha256() == first
    other_weights(cnn_model, tmp_path / "other.onnx")
    shutil.copyfile(tmp_path / "other.onnx", cnn_model)
    assert handle.current_sha256() not in (None, first)
    cnn_model.unlink()
    assert handle.current_sha256() is None


def test_a_model_whose_external_data_changed_is_another_model(cnn_model, tmp_path):
    folder = tmp_path / "external"
    folder.mkdir()
    onnx.save(onnx.load(str(cnn_model)), str(folder / "m.onnx"), save_as_external_data=True, size_threshold=0)
    handle = ModelHandle.from_path(folder / "m.onnx")
    (data,) = handle.external_data
    first = handle.sha256
    assert handle.current_sha256() == first
    data.write_bytes(bytes(reversed(data.read_bytes())))  # the model file itself is untouched
    assert handle.current_sha256() not in (None, first)


# -- a metric that returns no number -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("returned", "named"),
    [
        ("'0.98'", "str '0.98'"),
        ("True", "bool True"),
        ("(0.9, 1)", "tuple (0.9, 1)"),
        ("{'a': 1.0}", "dict"),
        ("None", "NoneType None"),
    ],
)
def test_a_metric_that_returns_no_number_says_what_it_returned(make_config, tmp_path, capsys, returned, named):
    script = tmp_path / "metric.py"
    script.write_text(f"def score(outputs, data):\n    return {returned}\n")
    config = make_config(evaluation={"metric": f"{script}:score", "latency": {"warmup": 0, "repeats": 2}})
    code = main(["run", str(write_config(tmp_path, config)), "-q", "-o", str(tmp_path / "out")])
    line = one_line(code, capsys.readouterr().err, "metric.py:score", f"returned {named}", "real number")
    assert "raised" not in line
    assert not (tmp_path / "out").exists(), "no run is recorded on a metric that gives no score"


def test_a_metric_returning_a_numpy_number_is_a_score(make_config, tmp_path):
    script = tmp_path / "metric.py"
    script.write_text(
        "import numpy as np\n\ndef score(outputs, data):\n"
        "    return np.mean(np.argmax(next(iter(outputs.values())), axis=1) == data['label'])\n"
    )
    config = make_config(evaluation={"metric": f"{script}:score", "latency": {"warmup": 0, "repeats": 2}})
    config["stop"] = {"max_trials": 1}
    result = quantune.tune(config, output=tmp_path / "out")
    assert 0.0 <= result.baseline[f"{script}:score"] <= 1.0


# -- a model quantized already ----------------------------------------------------------------------


class Rows(CalibrationDataReader):
    def __init__(self, inputs: np.ndarray) -> None:
        self.rows = iter([{"input": inputs[i : i + 1]} for i in range(len(inputs))])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.rows, None)


def qdq_model(cnn_model: Path, cnn_data: dict[str, Path], target: Path) -> Path:
    inputs = np.load(cnn_data["calibration"])["input"][:8]
    quantize_static(str(cnn_model), str(target), Rows(inputs), quant_format=QuantFormat.QDQ)
    return target


@pytest.mark.parametrize("form", ["QDQ", "QOperator"])
def test_a_quantized_model_is_named_before_any_trial(make_config, cnn_model, cnn_data, tmp_path, capsys, form):
    target = tmp_path / "quantized.onnx"
    if form == "QDQ":
        qdq_model(cnn_model, cnn_data, target)
    else:
        quantize_dynamic(str(cnn_model), str(target))
    config = make_config(model=str(target))
    code = main(["check", str(write_config(tmp_path, config))])
    line = one_line(code, capsys.readouterr().err, "model", "quantized.onnx", "quantized already", f"{form} form")
    assert "dynamic_quant" in line and "float32" in line, line


def test_a_quantized_model_runs_through_passes_that_do_not_quantize(make_config, cnn_model, cnn_data, tmp_path):
    target = qdq_model(cnn_model, cnn_data, tmp_path / "quantized.onnx")
    config = make_config([{"name": "graph_opt"}], model=str(target), stop={"max_trials": 1})
    result = quantune.tune(config, output=tmp_path / "out")
    assert result.trials and result.trials[0].status == "ok", result.trials[0].error


# -- a cache folder inside the output folder --------------------------------------------------------


def test_a_cache_inside_the_output_folder_is_quantunes_own(make_config, tmp_path, capsys):
    out = tmp_path / "out"
    config = make_config(cache_dir=str(out / "cache"), stop={"max_trials": 1})
    path = write_config(tmp_path, config)
    assert main(["run", str(path), "-q", "-o", str(out)]) == 0, capsys.readouterr().err
    assert (out / "results.json").is_file() and (out / "cache" / "models").is_dir()
    assert main(["run", str(path), "-q", "-o", str(out), "--restart"]) == 0, capsys.readouterr().err
    assert main(["run", str(path), "-q", "-o", str(out)]) == 0, capsys.readouterr().err  # a resume
    assert (out / "results.json").is_file() and (out / "cache" / "models").is_dir()


def test_a_cache_inside_a_folder_quantune_rewrites_is_refused(make_config, tmp_path, capsys):
    out = tmp_path / "out"
    config = make_config(cache_dir=str(out / "best" / "cache"), stop={"max_trials": 1})
    code = main(["run", str(write_config(tmp_path, config)), "-q", "-o", str(out)])
    one_line(code, capsys.readouterr().err, "cache_dir", "best", "rewrites")


# -- a model whose external data is missing ---------------------------------------------------------


def test_a_missing_external_data_file_is_named(make_config, cnn_model, tmp_path, capsys):
    folder = tmp_path / "external"
    folder.mkdir()
    proto = onnx.load(str(cnn_model))
    onnx.save(proto, str(folder / "model.onnx"), save_as_external_data=True, location="weights.bin", size_threshold=0)
    (folder / "weights.bin").unlink()
    config = make_config(model=str(folder / "model.onnx"))
    code = main(["check", str(write_config(tmp_path, config))])
    line = one_line(code, capsys.readouterr().err, "model:", "model.onnx", "weights.bin", "external data")
    assert "No such file" not in line and "Errno" not in line, line
