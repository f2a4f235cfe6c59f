"""A static ceiling timed on a stand-in calibrated on two rows when the first guess is dynamic
(issue 23: the whole run, once the first guess is the answer, should not wait for a calibration
only the speed ceilings wanted): the stand-in's graph is the original's, the guess never gets one,
a static first guess means none, and a static variant the search goes on in is tried with its own
full calibration."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import onnx
import pytest

from conftest import accuracy_problem
from quantune.data.dataset import load_dataset
from quantune.engine.measure.ahead import calibrates
from quantune.passes import get_pass
from quantune.passes.base import PassContext
from quantune.strategy import Outcome, create_strategy
from quantune.strategy.accuracy.speed import STAND_IN_ROWS
from test_answer_early import _matmul_config

ROWS = "static_quant.calibration_samples"


def _both_flows(tmp_path: Path, **options: Any) -> dict[str, Any]:
    """The MLP of test_answer_early (MatMul-heavy: the first guess is the dynamic flow), with a static
    and a dynamic flow."""
    config = _matmul_config(tmp_path)
    config["passes"] = [{"name": "static_quant", "search": True}, {"name": "dynamic_quant", "search": True}]
    config["flows"] = [["static_quant"], ["dynamic_quant"]]
    config["search"] = {"strategy": "quantune", "strategy_options": {"first_guess": True, **options}}
    return config


def _first_ceilings(
    config: dict[str, Any], ratio_of, guess_meets: bool, guess_flow: str = "dynamic_quant"
) -> tuple[Any, list, list]:
    """Drives the strategy through its first guess and its ceiling stage; (strategy, the points the
    ceilings timed with their flows, the proposals that followed)."""
    timed: list = []

    def ratios(items, threshold, budget_s, **keywords):
        timed.extend((dict(point), tuple(flow)) for point, flow in items)
        return [ratio_of(dict(point), tuple(flow)) for point, flow in items]

    options = config["search"]["strategy_options"]
    problem = dataclasses.replace(accuracy_problem(config, options, timed=True), ceiling_ratios=ratios)
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    strategy.observe_baseline({"cosine": 1.0, "latency_ms": 1.0})
    guess = strategy.ask()
    assert guess.stage.startswith("first guess") and tuple(guess.flow) == (guess_flow,)
    strategy.tell(guess, Outcome(0.99, 0.0 if guess_meets else 0.1, guess_meets, {"latency_ms": 0.5}))
    after = []
    proposal = strategy.ask()
    while proposal is not None and len(after) < 3:
        after.append(proposal)
        strategy.tell(proposal, Outcome(0.5, 0.5, False, {"latency_ms": 0.5}))
        proposal = strategy.ask()
    return strategy, timed, [guess, *after]


def test_a_dynamic_guess_times_the_static_ceilings_on_stand_ins(tmp_path: Path) -> None:
    config = _both_flows(tmp_path)
    strategy, timed, proposals = _first_ceilings(config, lambda point, flow: 0.5, guess_meets=True)
    static = [point for point, flow in timed if flow == ("static_quant",)]
    dynamic = [point for point, flow in timed if flow == ("dynamic_quant",)]
    assert static and dynamic
    assert all(point[ROWS] == STAND_IN_ROWS for point in static)
    assert all(ROWS not in point for point in dynamic)
    guess = proposals[0]
    assert dict(guess.point) in dynamic  # the guess itself is timed as it was evaluated
    # every ceiling at the same speed: the guess, in budget, is at the ceiling and the search ends
    assert len(proposals) == 1 and "nothing faster is possible" in strategy.finished_reason


def test_a_static_variant_the_search_goes_on_in_is_tried_fully_calibrated(tmp_path: Path) -> None:
    config = _both_flows(tmp_path)

    def static_fastest(point, flow):
        return 0.4 if flow == ("static_quant",) else 0.6

    _, timed, proposals = _first_ceilings(config, static_fastest, guess_meets=False)
    assert any(point.get(ROWS) == STAND_IN_ROWS for point, _ in timed)
    ceiling = next(p for p in proposals[1:] if p.stage.startswith("ceiling"))
    assert tuple(ceiling.flow) == ("static_quant",)
    assert ROWS not in ceiling.point  # its own calibration, the user's rows, not the stand-in's


def test_no_stand_ins_when_turned_off(tmp_path: Path) -> None:
    _, timed, _ = _first_ceilings(_both_flows(tmp_path, stand_ins=False), lambda point, flow: 0.5, guess_meets=True)
    assert timed and all(ROWS not in point for point, _ in timed)


def test_no_stand_ins_when_the_guess_calibrates(tmp_path: Path) -> None:
    """Only the static flow: the guess calibrates beside the original, and the ceilings reuse its ranges."""
    config = _both_flows(tmp_path)
    config["passes"], config["flows"] = [{"name": "static_quant", "search": True}], [["static_quant"]]
    _, timed, proposals = _first_ceilings(config, lambda point, flow: 0.5, guess_meets=False, guess_flow="static_quant")
    assert timed and all(ROWS not in point for point, _ in timed)
    assert ROWS not in proposals[0].point


def test_a_stand_in_runs_the_same_graph_and_is_light_to_build(tmp_path: Path) -> None:
    """The premise: calibration rows move scales and zero points only. The same static point built
    on two rows and on all 32 gives the same nodes, inputs and outputs (only initializer values
    differ); and the builds ahead count the stand-in light (built by either worker, any time)."""
    config = _both_flows(tmp_path)
    problem = accuracy_problem(config, {}, timed=True)
    source = Path(config["model"])
    static = get_pass("static_quant")
    calibration = load_dataset(config["data"]["calibration"], field_name="data.calibration", base_dir=tmp_path)
    graphs = []
    for rows in (None, STAND_IN_ROWS):
        out = tmp_path / f"q{rows}.onnx"
        context = PassContext(calibration, ["x"], 8, tmp_path, cache_dir=tmp_path / "c", model_sha256="chain")
        static().run(static.Config(calibration_samples=rows), source, out, context)
        model = onnx.load(str(out))
        graphs.append(([(n.op_type, list(n.input), list(n.output)) for n in model.graph.node], model))
    assert graphs[0][0] == graphs[1][0]
    scales = [
        {i.name: onnx.numpy_helper.to_array(i).tobytes() for i in model.graph.initializer if "scale" in i.name}
        for _, model in graphs
    ]
    assert scales[0] != scales[1]  # two rows do give other ranges: the builds differ in values only
    passes = problem.step_passes
    assert calibrates(("static_quant",), passes, {})
    assert not calibrates(("static_quant",), passes, {ROWS: STAND_IN_ROWS})
    assert not calibrates(("dynamic_quant",), passes, {})


def test_the_ranges_are_published_before_the_model_is_quantized(tmp_path: Path, monkeypatch) -> None:
    """Two stand-ins of one calibration in the two build workers: the second reads the first's ranges
    as soon as they are computed, not once its quantization is done too (MiniLM-L3: the second
    worker calibrated the same two rows again, 1.1 s instead of 0.5 s). A quantization that fails
    leaves the ranges cached: they are the data's, whatever the quantizer does with them."""
    config = _both_flows(tmp_path)
    source = Path(config["model"])
    static = get_pass("static_quant")
    calibration = load_dataset(config["data"]["calibration"], field_name="data.calibration", base_dir=tmp_path)
    context = PassContext(calibration, ["x"], 8, tmp_path, cache_dir=tmp_path / "c", model_sha256="chain")
    settings = static.Config(calibration_samples=STAND_IN_ROWS)
    ranges, _ = static._calibration_cache(settings, context)
    seen: list[bool] = []

    def quantize(*args: Any) -> None:
        seen.append(ranges.is_file())
        raise RuntimeError("the quantizer failed")

    monkeypatch.setattr(static, "_quantize", staticmethod(quantize))
    with pytest.raises(RuntimeError, match="the quantizer failed"):
        static().run(settings, source, tmp_path / "q.onnx", context)
    assert seen == [True] and ranges.is_file()
    assert not list((tmp_path / "c").glob(".*.json"))  # no half-written file left beside it


def test_every_ceiling_within_the_margin_and_the_guess_in_budget_stands_it_for_the_confirmation(
    tmp_path: Path,
) -> None:
    """No ceiling surely below the margin: no fallback could win. With the guess in budget, that is
    not "keep the original" -- the guess is the answer, and the closing re-timing judges it."""
    config = _both_flows(tmp_path)
    strategy, _, proposals = _first_ceilings(config, lambda point, flow: 0.99, guess_meets=True)
    assert len(proposals) == 1 and "no fallback could win" in strategy.finished_reason
    assert "trial" in strategy.finished_reason and "in budget already" in strategy.finished_reason
    strategy, _, _ = _first_ceilings(config, lambda point, flow: 0.99, guess_meets=False)
    assert "no fallback could win" in strategy.finished_reason and "in budget already" not in strategy.finished_reason
    strategy, _, _ = _first_ceilings(config, lambda point, flow: 1.2, guess_meets=True)  # every one surely slower
    assert "no fallback could win" in strategy.finished_reason and "in budget already" not in strategy.finished_reason
