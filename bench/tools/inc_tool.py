"""Intel Neural Compressor 2.x (ONNX Runtime adaptor): accuracy-driven post-training static quantization.

Usage: python inc_tool.py CASE.json OUT_DIR [strategy] [approach] [early]
    (runs in venv-inc; strategy: basic | mse_v2 | mse | auto; approach: static | dynamic)

quant_level=1 is set, because the default quant_level="auto" ignores the strategy named.
Everything else is Neural Compressor's default, as its users run it, but the time limit: the
case's own limit is passed as ``TuningCriterion.timeout``, and with a timeout above 0 Neural
Compressor keeps tuning after its first model within the budget, for a faster one, until
``max_trials`` or the timeout (its exit policy, ``strategy.py: stop``). ``early`` passes its
default ``timeout=0`` instead: it stops at the first model within the budget (the harness's
kill still bounds the run).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import Scorer, calibration_batches, load_case, stop_by_limits, write_result


class CalibLoader:
    """What INC's ONNX adaptor iterates for calibration: (inputs dict, label) with a batch_size."""

    def __init__(self, case: dict) -> None:
        self.batch_size = 1
        self.items = calibration_batches(case, batch_size=1)

    def __iter__(self):
        for item in self.items:
            yield item, None

    def __len__(self) -> int:
        return len(self.items)


def main() -> None:
    case = load_case(sys.argv[1])
    out = Path(sys.argv[2]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    strategy = sys.argv[3] if len(sys.argv) > 3 else case.get("inc_strategy", "basic")
    approach = sys.argv[4] if len(sys.argv) > 4 else "static"
    early = len(sys.argv) > 5 and sys.argv[5] == "early"
    from neural_compressor import quantization
    from neural_compressor.config import AccuracyCriterion, PostTrainingQuantConfig, TuningCriterion

    loader = CalibLoader(case)
    scorer = Scorer(case)
    static = approach == "static"
    conf = PostTrainingQuantConfig(
        approach=approach,
        quant_level=1,
        calibration_sampling_size=[len(loader)] if static else [100],
        accuracy_criterion=AccuracyCriterion(
            higher_is_better=case["higher_is_better"], criterion="relative", tolerable_loss=case["tolerable_loss"]
        ),
        tuning_criterion=TuningCriterion(
            strategy=strategy, max_trials=case["max_trials"], timeout=0 if early else int(case["timeout_s"])
        ),
    )
    started = time.perf_counter()
    scorer.restart_clock()
    model = quantization.fit(
        model=case["model"], conf=conf, calib_dataloader=loader if static else None, eval_func=scorer.score_proto
    )
    total = time.perf_counter() - started
    path = None
    if model is not None:
        path = out / "model.onnx"
        model.save(str(path))
    write_result(
        out,
        {
            "tool": f"inc-{strategy}-{'early-' if early else ''}{approach}",
            "status": "ok" if model is not None else "no model met the budget",
            "model": str(path) if path else None,
            "first_feasible_s": scorer.first_feasible_s,
            "total_s": total,
            "evaluations": scorer.evaluations,
            "first_feasible_evaluations": scorer.first_feasible_evaluations,
            "tool_metric": scorer.history[-1]["value"] if scorer.history else None,
            "stop": stop_reason(model is not None, scorer, case, total, early),
            "history": scorer.history,
        },
    )


def stop_reason(found: bool, scorer: Scorer, case: dict, total_s: float, early: bool) -> str:
    """What ended Neural Compressor's tuning (fit returns a model or None without saying why), by
    its exit policy: the first model in budget (timeout 0 only), max_trials, its timeout, or a
    tuning space with nothing left to try."""
    if early and found:
        return f"accuracy reached after {scorer.evaluations} evaluation(s)"
    limit = case if not early else {**case, "timeout_s": float("inf")}
    return stop_by_limits(found, scorer.evaluations, limit, total_s, "tuning space exhausted")


if __name__ == "__main__":
    main()
