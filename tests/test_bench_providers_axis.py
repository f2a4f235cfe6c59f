"""The provider axis table's summary (bench/providers_axis.py): checked on case dicts written here.

No timing is asserted: the figures are written by hand, as ``axis_case`` records them, and the
test checks what the summary concludes from them (quantune's final ratio against the best peer
in budget, and whether an original on another provider beats every int8 model).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

axis = pytest.importorskip("providers_axis")


def figure(ratio: float, metric: float = 1.0, **extra: Any) -> dict[str, Any]:
    return {"metric": metric, "ratio": {"ratio_median": ratio, "ratio_ci_low": None, "ratio_ci_high": None}, **extra}


def case(auto_flow: list[str], auto_provider: str, quantune: float, peers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    figures = {
        "original on CPU EP": figure(1.0),
        "original on OpenVINO EP": figure(0.6),
        "best int8 on CPU EP": figure(0.7),
        "that int8 on OpenVINO EP": figure(0.65, metric=0.5),  # out of budget on OpenVINO
        "quantune providers: auto": figure(quantune),
        **peers,
    }
    return {
        "case": "c",
        "metric": "top1",
        "figures": figures,
        "cpu_only": {"verdict": "improved", "reason": "-"},
        "auto": {"verdict": "improved", "reason": "-", "provider": auto_provider, "flow": auto_flow},
        "peers": {label.split(" ")[0]: "ok" for label in peers},
        "peer_labels": list(peers),
        "tolerable_loss": 0.01,
    }


def test_the_original_elsewhere_beating_every_int8_model_is_found_and_credited() -> None:
    peers = {"inc on CPU EP": figure(0.66, meets=True), "nncf_ov on OpenVINO": figure(0.3, meets=False)}
    found = axis.summary(case(["provider"], axis.OPENVINO, 0.6, peers))
    assert found["original_elsewhere_beats_int8"] and found["returned_it"]
    assert found["best_peer"] == 0.66 and found["speedup_over_peer"] == pytest.approx(1.1)
    other = axis.summary(case(["static_quant", "provider"], axis.CPU, 0.7, peers))
    assert other["original_elsewhere_beats_int8"] and not other["returned_it"]


def test_no_peer_in_budget_is_the_original_and_the_table_says_the_median() -> None:
    peers = {"inc on CPU EP": figure(0.5, metric=0.2, meets=False)}
    found = axis.summary(case(["static_quant", "provider"], axis.CPU, 0.5, peers))
    assert found["best_peer"] == 1.0 and found["speedup_over_peer"] == pytest.approx(2.0)
    text = axis.axis_markdown([case(["provider"], axis.OPENVINO, 0.5, peers)], "cmd")
    assert "**2.00x**" in text and "c (quantune returned it)" in text


def test_an_original_elsewhere_slower_than_the_original_is_not_the_answer() -> None:
    slow = case(["static_quant", "provider"], axis.CPU, 1.0, {})
    slow["figures"]["original on OpenVINO EP"] = figure(2.0)
    slow["figures"]["best int8 on CPU EP"] = figure(0.9, metric=0.5)  # no int8 model in budget
    slow["figures"]["that int8 on OpenVINO EP"] = figure(0.9, metric=0.5)
    assert not axis.summary(slow)["original_elsewhere_beats_int8"]  # keeping the original is the answer


def test_the_table_counts_accuracy_measured_elsewhere_and_covers_the_zoo() -> None:
    measured = case(["provider"], axis.OPENVINO, 0.5, {})
    measured["measured_elsewhere"] = {
        "auto": {"checked": 4, "elsewhere": 0},
        "cpu_only": {"checked": 3, "elsewhere": 1},
    }
    text = axis.axis_markdown([measured], "cmd")
    assert "auto: 0 of 4, CPU-only: 1 of 3" in text and "**1** of 7" in text
    providers = pytest.importorskip("providers")
    names = providers.case_names("digits,zoo")
    assert names[0] == "digits" and {"nudenet_320n", "doclaynet_yolov8", "ddddocr_det"} <= set(names)
