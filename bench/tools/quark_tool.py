"""AMD Quark (ONNX) AutoSearch: grid search over static int8 quantization configs, custom evaluator.

Usage: python quark_tool.py CASE.json OUT_DIR   (runs in venv-quark)

AutoSearch keeps every config whose metric drop (baseline - value, in metric units) is within
the tolerance; it ranks candidates by that drop alone (it has no latency objective), so its
answer is the candidate with the smallest drop. The space is the part of Quark's default
space that runs on onnxruntime's CPU provider without Quark's own custom ops or torch (no
power-of-two, int16, fast fine-tuning or SmoothQuant).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import Scorer, calibration_batches, load_case, stop_by_limits, write_result


def main() -> None:
    case = load_case(sys.argv[1])
    out = Path(sys.argv[2]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    from onnxruntime.quantization import CalibrationDataReader
    from quark.onnx import AutoSearch, CalibrationMethod, Config, QuantizationConfig, QuantType
    from quark.onnx.quantization.auto_search.auto_search_v1 import AutoSearchConfig

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = calibration_batches(case, batch_size=1)
            self.iterator = iter(self.items)

        def get_next(self):
            return next(self.iterator, None)

        def rewind(self) -> None:
            self.iterator = iter(self.items)

    scorer = Scorer(case)
    search = AutoSearchConfig()
    search.search_space = {
        "calibrate_method": [CalibrationMethod.MinMax, CalibrationMethod.Percentile, CalibrationMethod.Entropy],
        "activation_type": [QuantType.QUInt8, QuantType.QInt8],
        "weight_type": [QuantType.QInt8],
        "include_cle": [False, True],
        "include_auto_mp": [False],
        "include_fast_ft": [False],
        "include_sq": [False],
        "extra_options": {"ActivationSymmetric": [False, True]},
    }
    search.search_evaluator = scorer.score
    search.search_metric_tolerance = case["tolerable_loss"] * abs(case["baseline"])
    search.search_algo = "grid_search"
    search.search_cache_dir = str(out / "cache")
    search.search_output_dir = str(out / "search")
    search.search_stop_condition = {
        "find_n_candidates": -1,
        "iteration_limit": case["max_trials"],
        "time_limit": case["timeout_s"],
    }
    config = Config(global_quant_config=QuantizationConfig(execution_providers=["CPUExecutionProvider"]))
    started = time.perf_counter()
    scorer.restart_clock()
    candidates = AutoSearch(case["model"], config, search, calibration_data_reader=Reader()).search_model()
    total = time.perf_counter() - started
    best = min(candidates, key=lambda c: c["difference"]) if candidates else None
    write_result(
        out,
        {
            "tool": "quark",
            "status": "ok" if best else "no model met the budget",
            "model": best["model_path"] if best else None,
            "first_feasible_s": scorer.first_feasible_s,
            "total_s": total,
            "evaluations": scorer.evaluations,
            "first_feasible_evaluations": scorer.first_feasible_evaluations,
            "tool_metric": None,
            "stop": stop_by_limits(best is not None, scorer.evaluations, case, total, "grid exhausted"),
            "candidates": candidates,
            "history": scorer.history,
        },
    )


if __name__ == "__main__":
    main()
