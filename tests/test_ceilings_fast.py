"""Speed ceilings without accuracy evaluations, and few evaluations to the first model in budget.

The ceilings are timed in one side-by-side session whose rounds stop once they decide, within
a share of the time limit; only the fastest kept ceiling is evaluated; the first quantized
model in budget comes within ``ceil(log2 n) + 3`` full evaluations (n fallback units).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import accuracy_problem, save_graph
from quantune.evaluate.latency import LatencySpec, TimingRequest
from quantune.evaluate.rounds import time_until_decided
from quantune.space import Point
from quantune.strategy import WAIT, Outcome, create_strategy

LAYERS = 12


def in_batches(timings: Any) -> Any:
    """A backend's batches of rounds (``rounds.Timings``) from side-by-side rounds here: the rows a
    batch leaves out (None) come back as NaN rows."""

    def batch(models: list[Path | None], spec: LatencySpec, first: int) -> np.ndarray:
        rows = [row for row, model in enumerate(models) if model is not None]
        timed = timings([models[row] for row in rows], spec)
        column = np.full((len(models), timed.shape[1]), np.nan)
        column[rows] = timed
        return column

    return batch


def build_chain(path: Path, layers: int, width: int, seed: int = 0, shared: bool = False) -> Path:
    """``x[N, width]`` through ``layers`` MatMul -> Relu pairs: one fallback unit per MatMul.
    ``shared``: every MatMul multiplies by one weight (the work of many layers, the file of one)."""
    rng = np.random.default_rng(seed)
    nodes, inits, current = [], [], "x"
    for index in range(layers):
        name = "w0" if shared else f"w{index}"
        if not shared or not index:
            weight = rng.normal(0, 1 / np.sqrt(width), (width, width)).astype(np.float32)
            inits.append(numpy_helper.from_array(weight, name))
        nodes.append(helper.make_node("MatMul", [current, name], [f"m{index}"], name=f"mm{index}"))
        nodes.append(helper.make_node("Relu", [f"m{index}"], [f"r{index}"], name=f"relu{index}"))
        current = f"r{index}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, ["batch", width])],
        inits,
    )
    return save_graph(graph, path)


@pytest.fixture
def chain_config(tmp_path: Path) -> dict[str, Any]:
    model = build_chain(tmp_path / "chain.onnx", LAYERS, 16)
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "calib.npz", x=rng.normal(0, 1, (32, 16)).astype(np.float32))
    np.savez(tmp_path / "eval.npz", x=rng.normal(0, 1, (32, 16)).astype(np.float32))
    return {
        "model": str(model),
        "prepare": "off",
        "data": {"calibration": str(tmp_path / "calib.npz"), "evaluation": str(tmp_path / "eval.npz"), "batch_size": 8},
        "evaluation": {"metric": "cosine", "latency": {"warmup": 1, "repeats": 5, "threads": 1}},
        "criterion": {"type": "relative", "tolerable_loss": 0.01},
        "passes": [{"name": "static_quant", "search": True}, {"name": "dynamic_quant", "search": True}],
        "flows": [["static_quant"], ["dynamic_quant"]],
        "search": {"strategy": "quantune"},
        "stop": {"max_trials": 40, "timeout_s": 600},
        "cache_dir": str(tmp_path / "cache"),
        "executor": {"kind": "inline"},
    }


def _first_meeting(strategy: Any, judge, limit: int = 80) -> int | None:
    """ask/tell without the engine; the number of evaluations up to the first meeting one."""
    for count in range(1, limit + 1):
        proposal = strategy.ask()
        if proposal is None:
            return None
        assert proposal is not WAIT
        outcome = judge(proposal.point)
        strategy.tell(proposal, outcome)
        if outcome.meets:
            return count
    return None


@pytest.mark.parametrize("guess", [False, True])
@pytest.mark.parametrize("place", [0, 5, 10])
def test_first_model_in_budget_within_log2_units_plus_3(chain_config: dict[str, Any], place: int, guess: bool) -> None:
    """Wherever the sensitivity ranking puts the one MatMul that must stay float (first, middle,
    next to last), the first model in budget comes within ceil(log2 n) + 3 evaluations; the
    ceilings themselves cost none (they are timed, here by a made-up ratio), and a first guess
    that turns out slow costs one, which the bound absorbs."""
    ratios = {"dynamic_quant": 1.4, "QDQ": 0.6, "QOperator": 0.7}

    def ratio(point: Point, flow: tuple[str, ...]) -> float:
        return ratios["dynamic_quant"] if flow == ("dynamic_quant",) else ratios[point["static_quant.quant_format"]]

    problem = dataclasses.replace(
        accuracy_problem(chain_config, {"first_guess": guess}),
        latency_ratio=ratio,
        ceiling_ratios=None,
        node_costs=None,
    )
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    strategy.observe_baseline({"latency_ms": 1.0})
    ranked = [group for group, _ in strategy.ctx.ranked(strategy.ctx.base_point())]
    culprit = set(ranked[place].nodes)

    def judge(point: Point) -> Outcome:
        excluded = set(point.get("static_quant.nodes_to_exclude", []))
        meets = point.get("flow") == "static_quant" and culprit <= excluded
        return Outcome(1.0, 0.0 if meets else 0.2, meets, {"latency_ms": 0.6})

    first = _first_meeting(strategy, judge)
    units = len(strategy.ctx.candidates)
    assert units >= LAYERS
    assert first is not None and first <= math.ceil(math.log2(units)) + 3, (first, strategy.stage_log)
    stages = list(strategy.stage_log)
    if guess:  # a chain of MatMuls looks like a sequence model: the guess is the (here slow) dynamic ceiling
        assert stages.pop(0) == "first guess: dynamic_quant: dynamic int8/extended"
    assert stages[0].startswith("ceiling: static_quant: QDQ")  # the fastest, and only it
    assert sum(1 for stage in stages if stage.startswith("ceiling")) == 1


def test_the_ceiling_stage_keeps_to_its_share_of_the_time_limit(chain_config: dict[str, Any]) -> None:
    """A spent budget builds one variant (timed all the same) and leaves the others out."""
    strategy = create_strategy("quantune")
    problem = accuracy_problem(chain_config, timed=True)
    strategy.bind(problem)
    from quantune.strategy.accuracy.speed import speed_variants

    items = [(point, strategy.ctx.flow) for point, _ in speed_variants(strategy.ctx)]
    assert len(items) >= 2
    ratios = problem.ceiling_ratios(items, 0.97, 1e-9)
    assert ratios[0] is not None and ratios[0] > 0
    assert all(r is None for r in ratios[1:])
    full = problem.ceiling_ratios(items, 0.97, None)
    assert all(r is not None and r > 0 for r in full)


def test_rounds_stop_at_the_deadline_after_the_minimum(chain_config: dict[str, Any], tmp_path: Path) -> None:
    light = Path(chain_config["model"])
    heavy = build_chain(tmp_path / "heavy.onnx", 4 * LAYERS, 256)
    feeds = {"x": np.ones((8, 16), np.float32)}
    spec = LatencySpec(warmup=1, repeats=20, threads=1)
    timings = time_until_decided(
        TimingRequest((light, light), feeds, spec, threshold=0.97, deadline=time.perf_counter())
    )
    assert timings.shape == (2, 5)  # the deadline has passed: the minimum of rounds, no more
    heavy_feeds = {"x": np.ones((8, 256), np.float32)}
    light_wide = build_chain(tmp_path / "light_wide.onnx", 1, 256)
    timings = time_until_decided(TimingRequest((light_wide, heavy), heavy_feeds, spec, threshold=0.97, max_rounds=40))
    # 48 layers against 1: nearly every round says "slower", so the rounds stop before the maximum
    assert timings.shape == (2, timings.shape[1]) and 5 <= timings.shape[1] < 40


def test_a_decided_candidate_sits_out_later_rounds(tmp_path: Path) -> None:
    """The heavy model is decided (slower) early; when the rounds go on for the twin of the
    original (undecided near 1.0), the heavy one is no longer run: NaN in those rounds."""
    light = build_chain(tmp_path / "light.onnx", 1, 256)
    twin = build_chain(tmp_path / "twin.onnx", 1, 256)
    heavy = build_chain(tmp_path / "heavy.onnx", 48, 256)
    feeds = {"x": np.ones((8, 256), np.float32)}
    spec = LatencySpec(warmup=1, repeats=20, threads=1)
    timings = time_until_decided(TimingRequest((light, heavy, twin), feeds, spec, threshold=0.97, max_rounds=14))
    assert not np.isnan(timings[:, :5]).any()  # the first rounds run every model
    assert not np.isnan(timings[0]).any() and not np.isnan(timings[2]).any()
    if timings.shape[1] > 5 and np.isnan(timings[1]).any():
        first_gap = int(np.argmax(np.isnan(timings[1])))
        assert np.isnan(timings[1, first_gap:]).all()  # once out, out for good


def made_up(seconds: dict[Path, float]) -> Any:
    """Rounds as a backend's batches (``rounds.Timings``) of made-up seconds a call: each model's own
    figure, 1% apart round by round (a rule's answer, certain however busy the machine is)."""

    def batch(models: list[Path | None], spec: LatencySpec, first: int) -> np.ndarray:
        jitter = 1.0 + 0.01 * (np.arange(first, first + spec.repeats) % 3 - 1)
        return np.array([np.full(spec.repeats, np.nan) if m is None else seconds[m] * jitter for m in models])

    return batch


def test_a_candidate_far_slower_sits_out_after_two_rounds_only_for_the_ceilings(tmp_path: Path) -> None:
    """A variant eight times slower than an original of over 10 ms a call is no speed ceiling after
    two rounds: with ``early`` (the ceilings) it sits out from the third, and the rounds end there
    when it is the only candidate; its ratio is a decided one (no "unsure" mark). Without ``early``
    (paired timings, which need their five rounds) it runs the five; so does every candidate of an
    original of microseconds. Timed for real, the models are far apart by construction (eight times
    the work, a quarter of it), so a busy machine cannot bring a round near the rule's 15%; the rule
    is also asked with made-up seconds, batch by batch, as a target's rounds ask it."""
    from quantune.evaluate.rounds import EARLY_ROUNDS, UnsureRatio, ceiling_medians, decide_in_chunks, far_above

    light = build_chain(tmp_path / "light.onnx", 16, 512, shared=True)  # about 30 ms a call on one AVX2 core
    heavy = build_chain(tmp_path / "heavy.onnx", 128, 512, shared=True)
    lighter = build_chain(tmp_path / "lighter.onnx", 4, 512, shared=True)  # surely below the threshold
    feeds = {"x": np.ones((256, 512), np.float32)}
    spec = LatencySpec(warmup=1, repeats=20, threads=1)
    alone = time_until_decided(TimingRequest((light, heavy), feeds, spec, threshold=0.97, max_rounds=14, early=True))
    assert alone.shape == (2, EARLY_ROUNDS)
    medians = ceiling_medians(alone, 0.97)
    assert medians[0] is not None and medians[0] > 0.97 * 1.15 and not isinstance(medians[0], UnsureRatio)
    mixed = time_until_decided(
        TimingRequest((light, heavy, lighter), feeds, spec, threshold=0.97, max_rounds=8, early=True)
    )
    assert not np.isnan(mixed[:, :EARLY_ROUNDS]).any()
    assert np.isnan(mixed[1, EARLY_ROUNDS:]).all() and not np.isnan(mixed[2, :5]).any()  # the lighter goes on
    assert mixed.shape[1] >= 5
    plain = time_until_decided(TimingRequest((light, heavy), feeds, spec, threshold=0.97, max_rounds=14))
    assert plain.shape == (2, 5) and not np.isnan(plain).any()
    tiny, tiny_heavy = build_chain(tmp_path / "tiny.onnx", 1, 64), build_chain(tmp_path / "tiny4.onnx", 24, 64)
    small = {"x": np.ones((8, 64), np.float32)}
    quick = time_until_decided(
        TimingRequest((tiny, tiny_heavy), small, spec, threshold=0.97, max_rounds=14, early=True)
    )
    assert quick.shape[1] >= 5  # microseconds a call: no early rule
    # a target's rounds, batch by batch: the same rule, on made-up seconds (the twin: the original's speed)
    twin = tmp_path / "twin.onnx"
    seconds = made_up({light: 0.03, heavy: 0.12, twin: 0.03})
    chunks = decide_in_chunks(
        seconds, TimingRequest((light, heavy, twin), feeds, spec, threshold=0.97, max_rounds=8, early=True)
    )
    assert np.isnan(chunks[1, EARLY_ROUNDS:]).all() and not np.isnan(chunks[2, :5]).any()
    assert chunks.shape[1] >= 5
    plain = decide_in_chunks(seconds, TimingRequest((light, heavy), feeds, spec, threshold=0.97, max_rounds=14))
    assert plain.shape == (2, 5) and not np.isnan(plain).any()
    fast = made_up({tiny: 2e-5, tiny_heavy: 8e-5})
    quick = decide_in_chunks(
        fast, TimingRequest((tiny, tiny_heavy), small, spec, threshold=0.97, max_rounds=14, early=True)
    )
    assert quick.shape[1] >= 5  # microseconds a call: no early rule
    # the rule itself: two rounds, each at least 15% above the threshold; one round is not enough
    seconds = np.array([[0.02, 0.02, 0.02], [0.024, 0.026, 0.018]])
    assert far_above(seconds[:, :2], 0.97) == [True] and far_above(seconds[:, :1], 0.97) == [False]
    assert far_above(seconds, 0.97) == [False]  # a round at 0.9x: not far above
    assert far_above(seconds / 100, 0.97) == [False]  # the same ratios at 0.2 ms a call


def test_a_candidate_onnxruntime_cannot_load_sits_out_and_the_others_are_timed(tmp_path: Path) -> None:
    """Basic Pitch: one QDQ variant onnxruntime refuses ("Transpose invalid perm") made the whole
    ceiling stage fail, and every variant was dropped as failed."""
    from quantune.evaluate.rounds import ceiling_medians

    light = build_chain(tmp_path / "light.onnx", 1, 256)
    twin = build_chain(tmp_path / "twin.onnx", 1, 256)
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model")
    feeds = {"x": np.ones((8, 256), np.float32)}
    spec = LatencySpec(warmup=1, repeats=8, threads=1)
    timings = time_until_decided(TimingRequest((light, broken, twin), feeds, spec, threshold=0.97, max_rounds=8))
    assert np.isnan(timings[1]).all()
    assert not np.isnan(timings[2, :5]).any()
    medians = ceiling_medians(timings, 0.97)
    assert medians[0] is None and medians[1] is not None and medians[1] > 0


def test_variants_that_are_one_model_are_timed_once(chain_config: dict[str, Any]) -> None:
    """A chain of MatMuls has no convolution: its "mixed" dynamic model is its int8 one."""
    problem = accuracy_problem(chain_config, timed=True)
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    from quantune.strategy.accuracy.context import AccuracyContext
    from quantune.strategy.accuracy.speed import speed_variants

    dynamic = next(c for c in AccuracyContext.all_from_problem(problem, "quantune") if c.dynamic)
    variants = [point for point, _ in speed_variants(dynamic)]
    assert {p["dynamic_quant.weight_type"] for p in variants} == {"int8"}  # no convolution: mixed is not built
    items = [(point, dynamic.flow) for point in variants]
    items += [({**point, "dynamic_quant.weight_type": "mixed"}, dynamic.flow) for point in variants]
    ratios = problem.ceiling_ratios(items, 0.97, None)
    half = len(variants)
    assert all(r is not None for r in ratios) and ratios[:half] == ratios[half:]


def _guess(config: dict[str, Any]) -> str:
    """The first proposal of the quantune strategy with a first guess, its stage."""
    strategy = create_strategy("quantune")
    strategy.bind(accuracy_problem(config, {"first_guess": True}, timed=True))
    strategy.observe_baseline({"latency_ms": 1.0})
    proposal = strategy.ask()
    return proposal.stage


def test_the_first_guess_is_the_dynamic_flow_for_a_sequence_model(chain_config: dict[str, Any]) -> None:
    """More weighted MatMuls than convolutions: Neural Compressor's "NLP" model, quantized
    dynamically, the graph pre-optimized and int8 weights (no convolution wants uint8)."""
    assert _guess(chain_config) == "first guess: dynamic_quant: dynamic int8/extended"


def test_the_first_guess_is_static_uint8_for_a_cnn(make_config) -> None:
    config = make_config(
        passes=[{"name": "static_quant", "search": True}, {"name": "dynamic_quant", "search": True}],
        flows=[["static_quant"], ["dynamic_quant"]],
        search={"strategy": "quantune"},
    )
    assert _guess(config) == "first guess: static_quant: QDQ/uint8"


def test_no_first_guess_where_the_engine_would_evaluate_it_in_turn(chain_config: dict[str, Any]) -> None:
    """By default a first guess is made only where the engine evaluates it beside the original
    (``evaluates_ahead``): elsewhere it would be one more evaluation before the ceilings."""
    strategy = create_strategy("quantune")
    strategy.bind(accuracy_problem(chain_config, timed=True))
    assert not strategy.problem.evaluates_ahead
    strategy.observe_baseline({"latency_ms": 1.0})
    proposal = strategy.ask()  # timed first (the chain's ceilings may all be dropped: then nothing)
    assert proposal is None or proposal.stage.startswith("ceiling")
    assert not any(stage.startswith("first guess") for stage in strategy.stage_log)
    ahead = create_strategy("quantune")
    ahead.bind(dataclasses.replace(accuracy_problem(chain_config, timed=True), evaluates_ahead=True))
    ahead.observe_baseline({"latency_ms": 1.0})
    assert ahead.ask().stage.startswith("first guess")


def test_a_companion_keeps_its_reference_timed_until_their_pair_is_decided(tmp_path: Path) -> None:
    """A companion (``pairs``: a guess's lighter model) is decided against its reference row by the
    paired rule, not against the original: the reference -- decided slower than the original after
    five rounds -- goes on in every round the companion runs, and the rounds end only once the pair
    is decided (or at the most rounds)."""
    from quantune.evaluate.paired import MIN_GAIN
    from quantune.evaluate.rounds import decided

    light = build_chain(tmp_path / "light.onnx", 1, 256)
    heavy = build_chain(tmp_path / "heavy.onnx", 24, 256)
    twin = build_chain(tmp_path / "twin.onnx", 24, 256, seed=1)  # heavy's speed: a pair near 1.0
    feeds = {"x": np.ones((8, 256), np.float32)}
    spec = LatencySpec(warmup=1, repeats=20, threads=1)
    timings = time_until_decided(
        TimingRequest((light, heavy, twin), feeds, spec, threshold=0.97, max_rounds=14, pairs=[(2, 1)])
    )
    ran = ~np.isnan(timings)
    assert ran[0].all() and (ran[1] | ~ran[2]).all()  # wherever the companion ran, its reference did
    assert decided(timings[[1, 2]], 1.0 - MIN_GAIN)[0] or timings.shape[1] == 14
