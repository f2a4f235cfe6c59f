"""Smoke test of the bench harness (bench/run.py): quantune alone on the bundled digits case.

No peers, two trials: it checks that the harness runs a tool in its subprocess, re-measures the
result model and writes the table and its JSON; the speed figures themselves live in bench/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "bench" / "run.py"


@pytest.mark.skipif(not RUN.is_file(), reason="bench/ is not in this checkout")
def test_bench_runs_quantune_on_digits(tmp_path: Path) -> None:
    if not (REPO / "examples" / "digits" / "model.onnx").is_file():
        pytest.skip("the digits example is missing")
    pytest.importorskip("yaml")
    env = {**os.environ, "QUANTUNE_BENCH_CACHE": str(tmp_path / "cache"), "ORT_DISABLE_TELEMETRY": "1"}
    out = tmp_path / "results"
    args = [
        "--cases",
        "digits",
        "--tools",
        "quantune",
        "--max-trials",
        "2",
        "--timeout",
        "60",
        "--out",
        str(out),
    ]
    proc = subprocess.run(
        [sys.executable, str(RUN), *args], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    reports = list(out.glob("*.json"))
    assert len(reports) == 1 and list(out.glob("*.md"))
    report = json.loads(reports[0].read_text())
    rows = {row["tool"]: row for row in report["cases"][0]["rows"]}
    assert set(rows) == {"fp32", "quantune"}
    ours = rows["quantune"]
    assert ours["status"] == "ok", ours
    assert ours["meets"] is True and ours["latency_ms"] > 0 and 1 <= ours["evaluations"] <= 2
    assert 0.0 < ours["first_feasible_s"] <= ours["process_s"] <= 60 + 5
    assert ours["first_feasible_evaluations"] <= ours["evaluations"]
    assert "| quantune (strategy quantune, zero-knowledge) | ORT CPU | yes |" in proc.stdout
    assert ours["stop"] and ours["verdict"] and "## Summary across cases" in proc.stdout
