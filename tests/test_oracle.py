"""bench/oracle.py: the truth per fallback unit on the real metric, and a ranking scored against it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "decode_head"


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


ORACLE = _load(ROOT / "bench" / "oracle.py", "quantune_bench_oracle")


def test_spearman_and_ties() -> None:
    assert ORACLE.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert ORACLE.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert ORACLE.spearman([0, 0, 0], [1, 2, 3]) is None  # no truth to rank
    assert list(ORACLE.ranks([5.0, 1.0, 5.0])) == [2.5, 1.0, 2.5]


def test_score_order_finds_the_worst_units_rank() -> None:
    truth = {"a": 0.0, "b": 0.9, "c": 0.1, "d": 0.0}
    scored = ORACLE.score_order([["c", 3.0], ["b", 2.0], ["a", 1.0], ["d", 0.5]], truth)
    assert scored["worst_units"] == ["b"] and scored["worst_rank"] == 2
    assert scored["worst_in_top_1"] is False and scored["worst_in_top_3"] is True
    alike = ORACLE.score_order([["a", 1.0], ["b", 0.0]], {"a": 1.0, "b": 1.0})
    assert alike["worst_units"] == [] and alike["worst_in_top_3"] is None  # nothing to find


def test_oracle_on_a_decode_head(tmp_path: Path) -> None:
    build = _load(EXAMPLE / "build.py", "quantune_example_decode_head")
    model = build.build(tmp_path / "model.onnx")
    build.write_data(model, tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(
        (EXAMPLE / "config.yaml")
        .read_text()
        .replace("metric.py:score", f"{EXAMPLE / 'metric.py'}:score")
        .replace("{warmup: 2, repeats: 10, threads: 1}", "{warmup: 1, repeats: 3, threads: 1}")
    )
    table = ORACLE.run(model, config, tmp_path / "runs", "decode_head", None)
    rows = {row["unit"]: row for row in table["units"]}
    assert rows["head_concat"]["head"] and rows["head_concat"]["loss_alone_int8"] == pytest.approx(1.0)
    assert rows["head_concat"]["meets_alone_fp32"]  # the one unit whose fallback holds the budget
    assert not any(r["meets_alone_fp32"] for name, r in rows.items() if name != "head_concat")
    assert table["full_int8"]["meets"] is False
    for ranking in table["rankings"].values():
        assert ranking["worst_units"] == ["head_concat"]
        assert ranking["worst_in_top_1"] is True
        assert ranking["spearman"] is not None
    # the verdict's models (mostly int8, in budget) are re-timed side by side with the original
    assert table["retimed"] and all(r["meets"] and r["original_ms"] > 0 for r in table["retimed"])
    assert all("alone int8" not in r["stage"] for r in table["retimed"])
    text = ORACLE.markdown(table, "python bench/oracle.py ...")
    assert "| head_concat | Concat |" in text and "| sensitivity |" in text


def test_units_by_compute_group_and_their_ranking() -> None:
    """--by-compute: a Conv with the non-compute groups after it is one unit; a unit ranks at
    its best member's place."""
    from quantune.graph.capability import Group

    groups = [
        Group("sig0", "Sigmoid", ("sig0",), ()),
        Group("conv1", "Conv", ("conv1",), ()),
        Group("mul1", "Mul", ("mul1",), ()),
        Group("conv2", "Conv", ("conv2",), ()),
        Group("softmax", "Softmax", ("softmax",), ()),
        Group("concat", "Concat", ("concat",), ()),
    ]
    units = ORACLE.blocks(groups, by_compute=True)
    assert [u.name for u in units] == ["sig0", "conv1 +1", "conv2 +2"]
    assert units[2].op_type == "Conv+Softmax+Concat" and units[2].nodes == ("conv2", "softmax", "concat")
    assert [u.name for u in ORACLE.blocks(groups, by_compute=False)] == [g.name for g in groups]
    order = ORACLE.block_order([["concat", 9.0], ["mul1", 5.0], ["conv2", 4.0], ["sig0", 1.0]], units)
    assert order == [["conv2 +2", 9.0], ["conv1 +1", 5.0], ["sig0", 1.0]]
