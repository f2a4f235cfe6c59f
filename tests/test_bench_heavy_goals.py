"""The heavy goals' reader (bench/heavy_goals.py): checked on logs and results written here.

No timing is measured: the stamps and figures are written by hand, and the test checks what the
reader concludes from them (a check's time and its largest silent gap, fallback or plain int8).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

goals = pytest.importorskip("heavy_goals")


def test_a_stamped_log_gives_the_check_time_and_the_largest_gap_start_and_end_included(tmp_path: Path) -> None:
    log = tmp_path / "check-model.log"
    log.write_text(
        "start 100.0\n"
        "140.5 preparing the model: started\n"  # 40.5 s of silence from the start: the largest gap
        "150.0 measuring the original: 3/48 evaluation batches (5 s)\n"
        "150.5 Transpose -4)\n"  # a console line wrapped onto the next is stamped too
        "170.0 ok: the data fits the model\n"
        "end 171.0 load 9.1 9.0 8.7\n"
    )
    took, gap = goals.check_figures(log)
    assert took == pytest.approx(71.0)
    assert gap == pytest.approx(40.5)
    assert goals.verdict(took, 60.0).startswith("**missed**")
    assert goals.verdict(gap, 45.0).startswith("met")


def test_the_answer_is_a_fallback_only_when_the_chosen_trial_keeps_nodes_in_float() -> None:
    plain = {"best": {"params": {"flow": "dynamic_quant", "dynamic_quant.per_channel": True}}}
    kept = {"best": None, "closest_miss": {"params": {"static_quant.nodes_to_exclude": ["Conv_1"]}}}
    empty_list = {"best": {"params": {"static_quant.nodes_to_exclude": []}}}
    assert goals.fallback(plain) is False
    assert goals.fallback(kept) is True
    assert goals.fallback(empty_list) is False
    assert goals.fallback({"best": None, "closest_miss": None}) is None


def test_the_original_evaluation_is_read_from_the_runs_cache_not_a_trials_entry(tmp_path: Path) -> None:
    evals = tmp_path / "evals"
    evals.mkdir()
    (evals / "a.json").write_text('{"value": {"metrics": {"m": 0.9}, "latency_ms": 5.0}}')
    (evals / "b.json").write_text('{"value": {"metrics": {"m": 1.0}, "evaluation_s": 52.8, "timing_s": 40.1}}')
    assert goals.original_evaluation_s(tmp_path) == pytest.approx(52.8)
    (evals / "b.json").unlink()
    with pytest.raises(SystemExit, match="no evaluation of the original"):
        goals.original_evaluation_s(tmp_path)
