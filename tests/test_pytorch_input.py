"""PyTorch input: ``model: {pytorch: script.py:build, example_inputs: script.py:inputs}`` is exported
to ONNX once (cached by weights, scripts and settings) and tuned as any ONNX model."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

import quantune
from quantune.cli import main
from quantune.config import PyTorchModelConfig
from quantune.convert import dynamic_axes, export_pytorch
from quantune.data import Dataset
from quantune.errors import QuantuneError
from quantune.evaluate import open_session
from quantune.store import ArtifactCache

torch = pytest.importorskip("torch")

DIGITS = Path(__file__).resolve().parents[1] / "examples" / "digits"


def _digits_config(model: str | dict, tmp_path: Path) -> dict:
    return {
        "model": model,
        "data": {"calibration": str(DIGITS / "calib.npz"), "evaluation": str(DIGITS / "eval.npz"), "batch_size": 64},
        "evaluation": {"metric": "top1", "latency": {"warmup": 1, "repeats": 5, "threads": 1, "confirm_top": 0}},
        "passes": [
            {
                "name": "static_quant",
                "params": {"quant_format": "QDQ", "calibrate_method": "MinMax", "activation_type": "uint8"},
            }
        ],
        "stop": {"max_trials": 1},
        "cache_dir": str(tmp_path / "cache"),
        "executor": {"kind": "inline"},
    }


def test_the_digits_example_from_pytorch_tunes_like_its_onnx_model(tmp_path):
    """Same weights (net.py:build reads model.onnx's): the same original accuracy and the same int8 result."""
    pytorch = {"pytorch": str(DIGITS / "net.py") + ":build", "example_inputs": str(DIGITS / "net.py") + ":inputs"}
    from_torch = quantune.tune(_digits_config(pytorch, tmp_path), output=tmp_path / "pt")
    from_onnx = quantune.tune(_digits_config(str(DIGITS / "model.onnx"), tmp_path), output=tmp_path / "onnx")
    assert from_torch.baseline["top1"] == from_onnx.baseline["top1"]
    (torch_trial,), (onnx_trial,) = from_torch.trials, from_onnx.trials
    assert torch_trial.status == onnx_trial.status == "ok"
    assert abs(torch_trial.metrics["top1"] - onnx_trial.metrics["top1"]) <= 1 / 450 + 1e-9  # at most one image
    assert torch_trial.metrics["quantized_compute_fraction"] == onnx_trial.metrics["quantized_compute_fraction"]


SCRIPT = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(x).mean(dim=2)

def build():
    torch.manual_seed(SEED)
    return Net()

def inputs():
    return {"x": torch.zeros(2, 3, 5)}

def broken():
    raise RuntimeError("no checkpoint here")

def not_a_module():
    return 42
"""


def _script(tmp_path: Path, seed: int = 0) -> Path:
    path = tmp_path / "net.py"
    path.write_text(textwrap.dedent(SCRIPT).replace("SEED", str(seed)))
    return path


def _feeds(lengths: list[int]) -> Dataset:
    rng = np.random.default_rng(0)
    feeds = tuple({"x": rng.normal(size=(2, 3, n)).astype(np.float32)} for n in lengths)
    return Dataset(arrays={}, source="feeds", feeds=feeds)


def test_axes_that_vary_in_the_data_are_dynamic_and_the_export_runs_on_every_length(tmp_path):
    data = _feeds([5, 9, 17])
    assert dynamic_axes({"x": torch.zeros(2, 3, 5)}, [data]) == {"x": {0: "batch", 2: "x_dim2"}}
    assert dynamic_axes({"x": torch.zeros(2, 3, 5)}, [_feeds([5])]) == {"x": {0: "batch"}}
    _script(tmp_path)
    spec = PyTorchModelConfig(pytorch="net.py:build", example_inputs="net.py:inputs", exporter="torchscript")
    path = export_pytorch(spec, tmp_path, ArtifactCache(tmp_path / "cache"), [data], 2)
    session = open_session(path, threads=1)
    for feed in [*data.feeds, {"x": np.ones((7, 3, 30), np.float32)}]:
        assert session.run(None, feed)[0].shape == (feed["x"].shape[0], 4)


def test_the_export_is_cached_by_the_weights(tmp_path):
    cache = ArtifactCache(tmp_path / "cache")
    spec = PyTorchModelConfig(pytorch="net.py:build", example_inputs="net.py:inputs", exporter="torchscript")
    data = _feeds([5])
    _script(tmp_path, seed=0)
    first = export_pytorch(spec, tmp_path, cache, [data], 2)
    mtime = first.stat().st_mtime_ns
    assert export_pytorch(spec, tmp_path, cache, [data], 2) == first  # a hit: not exported again
    assert first.stat().st_mtime_ns == mtime
    _script(tmp_path, seed=1)  # other weights (and another script): another model
    assert export_pytorch(spec, tmp_path, cache, [data], 2) != first


@pytest.mark.parametrize(
    ("pytorch", "message"),
    [
        ("net.py:missing", r"model.pytorch: 'net.py' defines no function 'missing'"),
        ("net.py:broken", r"model.pytorch: 'net.py:broken' raised RuntimeError: no checkpoint here"),
        ("net.py:not_a_module", r"model.pytorch: 'net.py:not_a_module' returned int; expected a torch.nn.Module"),
        ("nothing.pt2", r"model.pytorch: no torch.export program at 'nothing.pt2'"),
    ],
)
def test_bad_pytorch_input_is_one_line_naming_the_field(tmp_path, pytorch, message):
    _script(tmp_path)
    spec = PyTorchModelConfig(pytorch=pytorch, example_inputs="net.py:inputs")
    with pytest.raises(QuantuneError, match=message):
        export_pytorch(spec, tmp_path, ArtifactCache(tmp_path / "cache"), [_feeds([5])], 2)


def test_an_export_failure_exits_2_with_one_line(tmp_path, capsys):
    (tmp_path / "net.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            class Warp(nn.Module):
                def forward(self, x):
                    grid = torch.zeros(x.shape[0], 4, 4, 2)
                    return nn.functional.grid_sample(x, grid, align_corners=False)

            def build():
                return Warp()
            """
        )
    )
    np.savez(tmp_path / "eval.npz", x=np.ones((4, 1, 4, 4), np.float32))
    config = tmp_path / "config.yaml"
    config.write_text(
        "model: {pytorch: net.py:build, exporter: torchscript, opset: 13}\n"
        "data: {evaluation: eval.npz, batch_size: 2}\n"
        "evaluation: {metric: cosine}\n"
        "passes: [{name: dynamic_quant}]\n"
        f"cache_dir: {tmp_path / 'cache'}\n"
    )
    assert main(["check", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "model.pytorch: torch.onnx.export of 'net.py:build' failed (torchscript:" in err


def test_a_saved_torch_export_program_is_an_input(tmp_path):
    _script(tmp_path)
    import importlib.util

    spec = importlib.util.spec_from_file_location("pt2_net", tmp_path / "net.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    net = module.build().eval()
    length = torch.export.Dim("length", min=2, max=64)
    program = torch.export.export(net, (torch.zeros(2, 3, 5),), dynamic_shapes=({2: length},))
    torch.export.save(program, str(tmp_path / "net.pt2"))
    data = _feeds([5, 9])
    path = export_pytorch(PyTorchModelConfig(pytorch="net.pt2"), tmp_path, ArtifactCache(tmp_path / "cache"), [data], 2)
    session = open_session(path, threads=1)
    assert [i.name for i in session.get_inputs()] == ["x"]
    feed = data.feeds[1]
    with torch.no_grad():
        expected = net(torch.from_numpy(feed["x"])).numpy()
    np.testing.assert_allclose(session.run(None, feed)[0], expected, rtol=1e-4, atol=1e-5)
