"""NNCF on OpenVINO: ``quantize_with_accuracy_control`` on the model read by OpenVINO, scored on
OpenVINO's runtime, saved as OpenVINO IR (the peer for the OpenVINO provider, issue 24).

Usage: python nncf_ov_tool.py CASE.json OUT_DIR   (runs in venv-nncf: nncf, openvino, onnxruntime)

The ONNX model is read with ``openvino.Core().read_model`` (what ``ov.convert_model`` does for an
ONNX file); NNCF quantizes it and reverts layers until the case's metric, computed on the whole
evaluation split from OpenVINO's outputs, is within the relative budget (``max_num_iterations`` =
the trial limit). NNCF compiles every candidate it validates with ``INFERENCE_PRECISION_HINT: f32``
(its accuracy control forces it; OpenVINO's own default on this CPU is bf16), so the IR is
scored, saved and timed with that hint: the model NNCF vouched for, as it vouched for it.
``ov.save_model(..., compress_to_fp16=False)``: the weights NNCF left in fp32 stay fp32.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("NNCF_DISABLE_TELEMETRY", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import (
    Scorer,
    accuracy_control_stop,
    batches,
    calibration_batches,
    load_case,
    meets,
    stack,
    write_result,
)

RUNTIME = {"name": "openvino", "config": {"INFERENCE_PRECISION_HINT": "f32"}}


def main() -> None:
    case = load_case(sys.argv[1])
    out = Path(sys.argv[2]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    import nncf
    import numpy as np
    import openvino as ov
    from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

    scorer = Scorer(case)
    calibration = calibration_batches(case, batch_size=1)
    validation = list(batches(scorer.data, case["input_names"], case["batch_size"]))
    model = ov.Core().read_model(case["model"])
    outputs = [port.get_any_name() for port in model.outputs]

    def validate(compiled, items):
        # a full evaluation on the whole split (a call on fewer items, NNCF probing whether the
        # metric is per-sample, is refused: NNCF then ranks the layers to revert by their outputs)
        items = list(items)
        if len(items) != len(validation):
            raise ValueError("the case's metric is defined on the whole evaluation split only")
        request = compiled.create_infer_request()
        chunks: list[list[np.ndarray]] = [[] for _ in outputs]
        for item in items:
            result = request.infer(item)
            for index, port in enumerate(compiled.outputs):
                chunks[index].append(np.array(result[port]))
        return scorer.score_outputs({name: stack(parts) for name, parts in zip(outputs, chunks, strict=True)}), None

    started = time.perf_counter()
    crash = None
    try:
        quantized = nncf.quantize_with_accuracy_control(
            model,
            calibration_dataset=nncf.Dataset(calibration),
            validation_dataset=nncf.Dataset(validation),
            validation_fn=validate,
            max_drop=case["tolerable_loss"],
            drop_type=nncf.DropType.RELATIVE,
            subset_size=len(calibration),
            advanced_accuracy_restorer_parameters=AdvancedAccuracyRestorerParameters(
                max_num_iterations=case["max_trials"]
            ),
        )
    except Exception as exc:  # NNCF's own failure is the row's finding, not a crash
        # e.g. nncf 3.4's ranker looks a quantizer up in the graph it removed the shape subgraphs
        # from (KeyError on captcha_ddddocr): the row keeps the fully quantized model NNCF starts
        # from (accuracy control only ranks when that model missed the budget) and says why
        crash = f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]} inside {_where(exc)}"
        quantized = nncf.quantize(model, nncf.Dataset(calibration), subset_size=len(calibration))
    total = time.perf_counter() - started
    path = out / "model.xml"
    ov.save_model(quantized, str(path), compress_to_fp16=False)
    candidates = scorer.evaluations  # NNCF's scores of candidates (its fp32 baseline not counted)
    final = scorer.score(path, RUNTIME)
    status = "ok" if scorer.first_feasible_s is not None else "no model met the budget"
    if crash is not None:
        status = (
            f"{'ok' if meets(case, final) else 'no model met the budget'}: NNCF's accuracy control failed "
            f"({crash}); the model is its fully quantized one, scored {final:.4f}"
        )
    write_result(
        out,
        {
            "tool": "nncf_ov",
            "status": status,
            "model": str(path),
            "runtime": RUNTIME,
            "first_feasible_s": scorer.first_feasible_s,
            "total_s": total,
            "evaluations": candidates,  # the final re-score above is not NNCF's
            "first_feasible_evaluations": scorer.first_feasible_evaluations,
            "tool_metric": final,
            "stop": accuracy_control_stop(scorer, case, candidates) if crash is None else crash,
            "history": scorer.history,
        },
    )


def _where(exc: BaseException) -> str:
    """The innermost frame of the traceback as ``module.function`` (where NNCF failed)."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "nncf"
    last = frames[-1]
    module = last.filename.rpartition("site-packages/")[2].removesuffix(".py").replace("/", ".")
    return f"{module}.{last.name}"


if __name__ == "__main__":
    main()
