"""NNCF: ``quantize_with_accuracy_control`` on the ONNX model (static int8, accuracy restorer).

Usage: python nncf_tool.py CASE.json OUT_DIR   (runs in venv-nncf; telemetry off via the harness's env)

The validation function scores the whole evaluation split with the case's metric (Pearson r, for
one, has no per-sample value), so NNCF ranks the layers to revert by their effect on the outputs.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("NNCF_DISABLE_TELEMETRY", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import Scorer, accuracy_control_stop, batches, calibration_batches, load_case, write_result


def main() -> None:
    case = load_case(sys.argv[1])
    out = Path(sys.argv[2]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    import nncf
    import onnx
    from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

    scorer = Scorer(case)
    calibration = calibration_batches(case, batch_size=1)
    validation = list(batches(scorer.data, case["input_names"], case["batch_size"]))
    model = onnx.load(case["model"])

    def validate(candidate, items):
        # a full evaluation on the whole split; a call on fewer items (NNCF probing whether the
        # metric is per-sample) is refused, so NNCF ranks layers by their outputs instead
        if len(list(items)) != len(validation):
            raise ValueError("the case's metric is defined on the whole evaluation split only")
        return scorer.score_proto(candidate), None

    started = time.perf_counter()
    scorer.restart_clock()
    note = ""
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
    except nncf.errors.UnsupportedBackendError as exc:
        # NNCF 3.4 has no ONNX ranking function: its accuracy restorer cannot run on ONNX
        # models, so when the quantized model misses the budget all it can give is that model
        note = f"accuracy restorer failed ({exc}); plain nncf.quantize model"
        quantized = nncf.quantize(model, nncf.Dataset(calibration), subset_size=len(calibration))
    total = time.perf_counter() - started
    path = out / "model.onnx"
    onnx.save(quantized, str(path))
    final = scorer.score(path)
    write_result(
        out,
        {
            "tool": "nncf",
            "status": note or ("ok" if scorer.first_feasible_s is not None else "no model met the budget"),
            "model": str(path),
            "first_feasible_s": scorer.first_feasible_s,
            "total_s": total,
            "evaluations": scorer.evaluations - 1,  # the final re-score above is not NNCF's
            "first_feasible_evaluations": scorer.first_feasible_evaluations,
            "tool_metric": final,
            "stop": note or accuracy_control_stop(scorer, case, scorer.evaluations - 1),
            "history": scorer.history,
        },
    )


if __name__ == "__main__":
    main()
