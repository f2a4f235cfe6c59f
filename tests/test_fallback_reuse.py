"""A fallback trial reuses what the flow it falls back from built: the activation ranges of a
static quantization do not depend on which nodes stay in float, so trials that differ only in
``nodes_to_exclude`` calibrate once (the bisection's steps cost a quantization and an evaluation,
not a calibration each)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from conftest import build_cnn, cnn_inputs
from quantune.data import Dataset
from quantune.passes import PassContext, get_pass
from quantune.passes.onnx import static_quant


def test_trials_that_differ_only_in_the_excluded_nodes_calibrate_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = build_cnn(tmp_path / "m.onnx")
    calibrations: list[int] = []
    calibrate = static_quant.calibrate_ranges

    def counted(*args, **kwargs):
        calibrations.append(1)
        return calibrate(*args, **kwargs)

    monkeypatch.setattr(static_quant, "calibrate_ranges", counted)
    quantizer, config = get_pass("static_quant"), get_pass("static_quant").Config
    context = PassContext(Dataset({"input": cnn_inputs(8, 1)}, "c"), ["input"], 8, tmp_path, "sha", tmp_path / "cache")
    for excluded in ([], ["conv2"], ["conv2", "fc"]):
        out = tmp_path / f"q-{len(excluded)}.onnx"
        quantizer().run(config.model_validate({"nodes_to_exclude": excluded}), model, out, context)
        graph = onnx.load(str(out)).graph
        dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
        quantized = {n.name for n in graph.node if n.op_type in ("Conv", "Gemm") and n.input[1] in dequantized}
        assert quantized == {"conv1", "conv2", "fc"} - set(excluded)  # excluded: float weights
    assert len(calibrations) == 1
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1
