"""The first guess's lighter models go with the speed ceilings (issue 23, "answer as soon as the
answer is known"): built ahead, timed in the ceilings' side-by-side session, their pairs with the
full model read from that session's rounds, and the compute-only one evaluated ahead -- so the
lighter stage costs no worker stage of its own (PP-OCRv6's recognizer: two paired timings of 2 s
and a 2.4 s trial after the ceilings)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

import quantune
from conftest import accuracy_problem
from quantune.engine.paired_timing import pair_key, remember_session_pairs, session_pair, session_pairs
from quantune.engine.prebuild import ceiling_items
from quantune.space import Point
from quantune.strategy import create_strategy
from test_answer_early import _all_meet, _drive, _layernorm

OPTIONS = {"drop_slow": False, "first_guess": True}


EXCLUDE = "static_quant.nodes_to_exclude"


def _lighter(point: Point) -> bool:
    return bool(point.get(EXCLUDE))


def test_the_guess_s_lighter_models_are_timed_with_the_ceilings_and_its_pairs_asked_of_them(tmp_path: Path) -> None:
    timed: list[list[tuple[dict, tuple]]] = []
    asked: list[tuple[dict, dict]] = []

    def ratios(items: Any, threshold: float, budget_s: Any) -> list[float]:
        timed.append([(dict(point), tuple(flow)) for point, flow in items])
        return [0.5] * len(items)

    def paired(candidate: Point, cflow: Any, reference: Point, rflow: Any) -> dict[str, Any]:
        asked.append((dict(candidate), dict(reference)))
        faster = _lighter(candidate) and not _lighter(reference)
        ratio = 0.8 if faster else 1.0
        return {"ratio_median": ratio, "ratio_ci_low": ratio - 0.02, "ratio_ci_high": ratio + 0.02, "faster": faster}

    config = _layernorm(tmp_path, "latency")  # MatMuls, and the Add/Mul/Div of its LayerNorms
    problem = dataclasses.replace(
        accuracy_problem(config, OPTIONS),
        ceiling_ratios=ratios,
        paired_latency=paired,
        session_pair=None,
        evaluates_ahead=True,
    )
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    strategy.observe_baseline({"latency_ms": 1.0})
    seen = _drive(strategy, _all_meet)
    assert seen[0][1].startswith("first guess")
    assert len(timed) == 1
    items = timed[0]
    extra = [(point, flow) for point, flow in items if _lighter(point)]
    guess = (dict(seen[0][0]), tuple(items[0][1]))
    at = items.index(guess) + 1  # (compute and Add/Mul, then) compute only: right after the guess, in its rounds
    assert extra and items[at : at + len(extra)] == extra
    exclude = "static_quant.nodes_to_exclude"
    assert all({k: v for k, v in point.items() if k != exclude} == guess[0] for point, _ in extra)  # the guess's
    assert [tuple(x) for x in strategy.evaluate_ahead] == [extra[-1]]  # compute only, evaluated ahead
    # the lighter stage asked exactly those pairs: what the ceilings' session timed
    lighter_pairs = [(c, r) for c, r in asked if _lighter(c) and not _lighter(r)]
    assert lighter_pairs and {json.dumps(c, sort_keys=True) for c, _ in lighter_pairs} == {
        json.dumps(point, sort_keys=True) for point, _ in extra
    }
    assert all(r == guess[0] for _, r in lighter_pairs)
    tried = [point for point, stage in seen if stage.startswith("lighter")]
    assert tried and json.dumps(tried[0], sort_keys=True) in {json.dumps(p, sort_keys=True) for p, _ in extra}


def test_the_lighter_stage_reads_the_session_s_answer_before_timing_a_pair(tmp_path: Path) -> None:
    timed: list[tuple[dict, dict]] = []

    def session(candidate: Point, cflow: Any, reference: Point, rflow: Any) -> dict[str, Any] | None:
        if not (_lighter(candidate) and not _lighter(reference)):
            return None  # the session decided only the lighter models against the full one
        return {"ratio_median": 0.8, "ratio_ci_low": 0.78, "ratio_ci_high": 0.82, "faster": True, "session": True}

    def paired(candidate: Point, cflow: Any, reference: Point, rflow: Any) -> dict[str, Any]:
        timed.append((dict(candidate), dict(reference)))
        return {"ratio_median": 1.0, "ratio_ci_low": 0.99, "ratio_ci_high": 1.01, "faster": False}

    config = _layernorm(tmp_path, "latency")
    problem = dataclasses.replace(
        accuracy_problem(config, OPTIONS), latency_ratio=lambda p, f: 0.5, paired_latency=paired, session_pair=session
    )
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    strategy.observe_baseline({"latency_ms": 1.0})
    seen = _drive(strategy, _all_meet)
    assert any(stage.startswith("lighter") for _, stage in seen)  # evaluated: the session said faster
    assert not any(_lighter(c) and not _lighter(r) for c, r in timed)  # no paired timing of those pairs


def test_the_dry_run_names_the_points_to_evaluate_ahead(tmp_path: Path) -> None:
    config = _layernorm(tmp_path, "latency")
    problem = dataclasses.replace(accuracy_problem(config, OPTIONS, timed=True), evaluates_ahead=True)
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    items, _, first, later = ceiling_items(strategy, lambda: create_strategy("quantune"))
    assert first in items and len(later) == 1 and later[0] in items and _lighter(later[0][0])
    no_guess = create_strategy("quantune")
    no_guess.bind(
        dataclasses.replace(
            accuracy_problem(config, {**OPTIONS, "first_guess": False}, timed=True), evaluates_ahead=True
        )
    )
    items, _, first, later = ceiling_items(no_guess, lambda: create_strategy("quantune"))
    assert items and first is None and later == [] and not any(_lighter(p) for p, _ in items)


def test_a_guess_out_of_budget_is_followed_by_its_compute_only_model_before_the_ceilings(tmp_path: Path) -> None:
    """MiniLM-L3: the dynamic guess missed, and its MatMul-only model -- in budget -- came only after
    the ceilings, in the op-type stage. Evaluated ahead, it is tried right after the guess."""
    timed: list[int] = []

    def ratios(items: Any, threshold: float, budget_s: Any) -> list[float]:
        timed.append(len(seen_before))
        return [0.5] * len(items)

    seen_before: list[str] = []

    def judge(point: Point) -> Any:
        from quantune.strategy import Outcome

        meets = _lighter(point)  # the fully quantized models miss, the lighter ones meet
        return Outcome(1.0, 0.0 if meets else 0.5, meets, {"latency_ms": 1.0})

    config = _layernorm(tmp_path, "latency")
    problem = dataclasses.replace(accuracy_problem(config, OPTIONS), ceiling_ratios=ratios, evaluates_ahead=True)
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    strategy.observe_baseline({"latency_ms": 1.0})
    for _ in range(40):
        proposal = strategy.ask()
        if proposal is None:
            break
        seen_before.append(proposal.stage)
        strategy.tell(proposal, judge(proposal.point))
        if len(seen_before) == 2:
            assert proposal.stage.endswith("compute only") and proposal.stage.startswith("first guess")
            assert (dict(proposal.point), tuple(proposal.flow)) == tuple(strategy.evaluate_ahead[0])
    assert timed == [2]  # the ceilings were timed after the guess and its compute-only model
    # without the engine evaluating it ahead, the guess is followed by the ceilings, as before
    plain = create_strategy("quantune")
    plain.bind(dataclasses.replace(problem, evaluates_ahead=False))
    plain.observe_baseline({"latency_ms": 1.0})
    first = plain.ask()
    plain.tell(first, judge(first.point))
    assert plain.evaluate_ahead == [] and not plain.ask().stage.startswith("first guess")


def test_of_two_lighter_models_the_compute_only_one_goes_first_unless_the_other_is_faster(tmp_path: Path) -> None:
    """Their ratios to the full model (0.80x and 0.81x on PP-OCRv6's recognizer) do not order them: the
    noise did. The compute-only one first, unless the other is faster than it side by side."""
    answers: dict[bool, bool] = {}

    def paired(candidate: Point, cflow: Any, reference: Point, rflow: Any) -> dict[str, Any]:
        faster = answers[len(candidate.get(EXCLUDE, [])) < len(reference.get(EXCLUDE, []))]
        return {"ratio_median": 0.9 if faster else 1.0, "faster": faster}

    config = _layernorm(tmp_path, "latency")
    problem = dataclasses.replace(accuracy_problem(config, OPTIONS), paired_latency=paired, session_pair=None)
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    strategy.observe_baseline({"latency_ms": 1.0})
    strategy.ask()  # sets up its contexts
    groups = list(strategy.ctx.candidates)
    base = strategy.ctx.base_point()
    other, compute_only = (0.80, groups[:1], "fewer in float"), (0.81, groups, "compute only")
    for fewer_is_faster in (False, True):
        answers.update({True: fewer_is_faster, False: False})
        order = [words for _, _, words in strategy._lighter_first(base, [other, compute_only])]
        assert order == (["fewer in float", "compute only"] if fewer_is_faster else ["compute only", "fewer in float"])


def _rows(*ratios: float, rounds: int = 20) -> np.ndarray:
    """Seconds per round: row 0 the original, each other row ``ratio`` times it, with a fixed wobble."""
    wobble = 1.0 + 0.01 * np.sin(np.arange(rounds))
    original = 0.01 * wobble
    return np.stack(
        [original, *(original * r * (1.0 + 0.002 * np.cos(np.arange(rounds) * (i + 2))) for i, r in enumerate(ratios))]
    )


def test_a_session_s_fast_pairs_are_decided_from_its_rounds() -> None:
    timings = _rows(0.75, 0.6, 1.5)  # full model, lighter model, a slow variant
    pairs = session_pairs(timings, threshold=0.97)
    assert set(pairs) == {(1, 2), (2, 1)}  # only the fast rows, both ways; never the original
    assert pairs[(2, 1)]["faster"] and not pairs[(1, 2)]["faster"]
    assert pairs[(2, 1)]["ratio_median"] == pytest_approx(0.8)
    timings[2, 10:] = np.nan  # a row that sat out: only the rounds both ran count
    assert session_pairs(timings, threshold=0.97)[(2, 1)]["rounds"] == 10


def test_an_undecided_pair_is_left_to_a_paired_timing_of_its_own() -> None:
    def straddling(rounds: int) -> np.ndarray:  # the lighter row 0.95x then 1.03x the full one, in turn
        timings = _rows(0.75, 0.75, rounds=rounds)
        timings[2] = timings[1] * np.where(np.arange(rounds) % 2 == 0, 0.95, 1.03)
        return timings

    assert session_pairs(straddling(8), threshold=0.97) == {}
    assert session_pairs(straddling(20), threshold=0.97) == {}  # still undecided: timed on its own
    assert set(session_pairs(_rows(0.75, 0.6), threshold=0.97)) == {(1, 2), (2, 1)}


def pytest_approx(value: float) -> Any:
    import pytest

    return pytest.approx(value, rel=0.02)


def test_a_pair_the_session_decided_is_read_back_for_the_lighter_stage_only(tmp_path: Path) -> None:
    """Real models through the pass cache; the pair's answer comes from the session's rounds, not a
    timing -- under a key of its own: the decisions that always took a paired timing still do."""
    from quantune.config import load_config
    from quantune.engine.probes import _builder
    from quantune.engine.setup import build_run

    config = _layernorm(tmp_path, "latency")
    config["cache_dir"] = str(tmp_path / "cache")
    context = build_run(load_config(config)).context
    build = _builder(context, context.plan)
    full = ({"static_quant.per_channel": False}, ("static_quant",))
    light = ({"static_quant.per_channel": True}, ("static_quant",))  # another model: its hash is what counts
    assert session_pair(context, light, full, build) is None  # not built yet: nothing is built to answer
    shas = [context.model.sha256, build(*full)[1], build(*light)[1]]
    assert session_pair(context, light, full, build) is None  # built, never timed in a session
    assert remember_session_pairs(context, shas, _rows(0.75, 0.6), threshold=0.97) == 2
    answer = session_pair(context, light, full, build)
    assert answer is not None and answer["session"] and answer["faster"]
    assert session_pair(context, full, light, build)["faster"] is False
    assert session_pair(context, full, full, build)["same_model"]
    assert context.cache.get_json("evals", pair_key(context, shas[1], shas[2])) is None  # paired_latency's own


def test_a_run_evaluates_the_guess_s_compute_only_model_ahead(make_config, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("QUANTUNE_PREBUILD", "1")
    config = _layernorm(tmp_path, "latency")
    config.update(executor={"kind": "process", "workers": 1}, stop={"max_trials": 3}, cache_dir=str(tmp_path / "c"))
    config["search"]["strategy_options"] = dict(OPTIONS)
    quantune.tune(config, output=tmp_path / "run")
    assert json.loads((tmp_path / "run" / "results.json").read_text())["trials"]
    log = (tmp_path / "run" / "workers" / "first_guess.log").read_text()
    assert "first guess: run set up in" in log and "ahead: run set up in" in log  # in the guess's worker, after it
    assert not (tmp_path / "run" / "workers" / "evaluate_ahead.log").exists()  # no worker of its own
    ahead = [json.loads(p.read_text())["value"] for p in (tmp_path / "c" / "evals").glob("*.json")]
    assert sum(1 for entry in ahead if entry.get("ahead")) == 2  # the first guess and its compute-only model
