"""The first guess's lighter models go with the speed ceilings (issue 23, "answer as soon as the
answer is known"): built ahead with them -- so the lighter stage times them in the engine's
process, not in worker stages -- and the compute-only one evaluated ahead, tried right after a
guess out of budget (PP-OCRv6's recognizer: two paired timings of 2 s and a 2.4 s trial after the
ceilings; MiniLM-L3: its first model in budget after the ceilings)."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import quantune
from conftest import accuracy_problem
from quantune.engine.measure.prebuild import ceiling_items
from quantune.space import Point
from quantune.strategy import create_strategy
from test_answer_early import _all_meet, _drive, _layernorm

OPTIONS = {"drop_slow": False, "first_guess": True}


EXCLUDE = "static_quant.nodes_to_exclude"


def _lighter(point: Point) -> bool:
    return bool(point.get(EXCLUDE))


def test_the_guess_s_lighter_models_are_built_ahead_and_are_what_the_lighter_stage_times(tmp_path: Path) -> None:
    timed: list[list[tuple[dict, tuple]]] = []
    companions: list[list[tuple[int, int]]] = []
    asked: list[tuple[dict, dict]] = []

    def ratios(items: Any, threshold: float, budget_s: Any, pairs: Any = (), anchor: Any = None) -> list[float]:
        timed.append([(dict(point), tuple(flow)) for point, flow in items])
        companions.append(list(pairs))
        return [0.5] * len(items)

    def paired(candidate: Point, cflow: Any, reference: Point, rflow: Any) -> dict[str, Any]:
        asked.append((dict(candidate), dict(reference)))
        faster = _lighter(candidate) and not _lighter(reference)
        ratio = 0.8 if faster else 1.0
        return {"ratio_median": ratio, "ratio_ci_low": ratio - 0.02, "ratio_ci_high": ratio + 0.02, "faster": faster}

    config = _layernorm(tmp_path, "latency")  # MatMuls, and the Add/Mul/Div of its LayerNorms
    problem = dataclasses.replace(
        accuracy_problem(config, OPTIONS), ceiling_ratios=ratios, paired_latency=paired, evaluates_ahead=True
    )
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    strategy.observe_baseline({"latency_ms": 1.0})
    seen = _drive(strategy, _all_meet)
    assert seen[0][1].startswith("first guess")
    assert len(timed) == 1
    guess = dict(seen[0][0])
    extra = [(dict(point), tuple(flow)) for point, flow in strategy.shared.build_ahead]
    # the guess is in budget: its lighter models are timed with the ceilings, each paired with it
    ceilings = [item for item in timed[0] if not _lighter(item[0])]
    assert timed[0] == ceilings + extra
    at = next(i for i, (point, _) in enumerate(ceilings) if point == guess)
    assert companions[0] == [(len(ceilings) + i, at) for i in range(len(extra))]
    assert extra and all(_lighter(point) for point, _ in extra)
    assert all({k: v for k, v in point.items() if k != EXCLUDE} == guess for point, _ in extra)  # the guess's
    assert [tuple(x) for x in strategy.shared.evaluate_ahead] == [extra[-1]]  # compute only, evaluated ahead
    # the lighter stage timed exactly those models against the guess, and evaluated one of them
    lighter_pairs = [(c, r) for c, r in asked if _lighter(c) and not _lighter(r)]
    assert {json.dumps(c, sort_keys=True) for c, _ in lighter_pairs} == {
        json.dumps(p, sort_keys=True) for p, _ in extra
    }
    assert all(r == guess for _, r in lighter_pairs)
    tried = [point for point, stage in seen if stage.startswith("lighter")]
    assert tried and json.dumps(tried[0], sort_keys=True) == json.dumps(extra[-1][0], sort_keys=True)


def test_the_declared_first_requests_name_the_points_to_build_and_evaluate_ahead(tmp_path: Path) -> None:
    config = _layernorm(tmp_path, "latency")
    problem = dataclasses.replace(accuracy_problem(config, OPTIONS, timed=True), evaluates_ahead=True)
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    items, _, first, later = ceiling_items(strategy, lambda: create_strategy("quantune"))
    lighter = [item for item in items if _lighter(item[0])]
    assert first in items and lighter and items[-len(lighter) :] == lighter  # built after the ceilings
    assert later == lighter[-1:]  # the compute-only one, evaluated too
    no_guess = create_strategy("quantune")
    options = {**OPTIONS, "first_guess": False}
    no_guess.bind(dataclasses.replace(accuracy_problem(config, options, timed=True), evaluates_ahead=True))
    items, _, first, later = ceiling_items(no_guess, lambda: create_strategy("quantune"))
    assert items and first is None and later == [] and not any(_lighter(p) for p, _ in items)


def test_a_guess_out_of_budget_is_followed_by_its_compute_only_model_before_the_ceilings(tmp_path: Path) -> None:
    """MiniLM-L3: the dynamic guess missed, and its MatMul-only model -- in budget -- came only after
    the ceilings, in the op-type stage. Evaluated ahead, it is tried right after the guess."""
    timed: list[int] = []

    def ratios(items: Any, threshold: float, budget_s: Any, **keywords: Any) -> list[float]:
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
            assert (dict(proposal.point), tuple(proposal.flow)) == tuple(strategy.shared.evaluate_ahead[0])
    assert timed == [2]  # the ceilings were timed after the guess and its compute-only model
    # without the engine evaluating it ahead, the guess is followed by the ceilings, as before
    plain = create_strategy("quantune")
    plain.bind(dataclasses.replace(problem, evaluates_ahead=False))
    plain.observe_baseline({"latency_ms": 1.0})
    first = plain.ask()
    plain.tell(first, judge(first.point))
    assert plain.shared.evaluate_ahead == [] and not plain.ask().stage.startswith("first guess")


def test_of_two_lighter_models_the_compute_only_one_goes_first_unless_the_other_is_faster(tmp_path: Path) -> None:
    """Their ratios to the full model (0.80x and 0.81x on PP-OCRv6's recognizer) do not order them: the
    noise did. The compute-only one first, unless the other is faster than it side by side."""
    answers: dict[bool, bool] = {}
    median = [0.9]  # a faster one's median ratio

    def paired(candidate: Point, cflow: Any, reference: Point, rflow: Any) -> dict[str, Any]:
        faster = answers[len(candidate.get(EXCLUDE, [])) < len(reference.get(EXCLUDE, []))]
        return {"ratio_median": median[0] if faster else 1.0, "faster": faster}

    config = _layernorm(tmp_path, "latency")
    problem = dataclasses.replace(accuracy_problem(config, OPTIONS), paired_latency=paired)
    strategy = create_strategy("quantune")
    strategy.bind(problem)
    strategy.observe_baseline({"latency_ms": 1.0})
    strategy.ask()  # sets up its contexts
    groups = list(strategy.ctx.candidates)
    base = strategy.ctx.base_point()
    other, compute_only = (0.80, groups[:1], "fewer in float"), (0.81, groups, "compute only")
    for fewer_is_faster in (False, True):
        answers.update({True: fewer_is_faster, False: False})
        order = [words for _, _, words in strategy.latency._lighter_first(base, [other, compute_only])]
        assert order == (["fewer in float", "compute only"] if fewer_is_faster else ["compute only", "fewer in float"])
    # faster beyond the noise, yet by less than a clear gain (0.97x): a tie, the compute-only one first
    answers.update({True: True, False: False})
    median[0] = 0.97
    order = [words for _, _, words in strategy.latency._lighter_first(base, [other, compute_only])]
    assert order == ["compute only", "fewer in float"]


def test_a_run_evaluates_the_guess_s_compute_only_model_ahead(make_config, tmp_path, monkeypatch) -> None:
    from quantune.engine.run import original

    monkeypatch.setenv("QUANTUNE_PREBUILD", "1")
    config = _layernorm(tmp_path, "latency")
    config.update(executor={"kind": "process", "workers": 1}, stop={"max_trials": 3}, cache_dir=str(tmp_path / "c"))
    config["search"]["strategy_options"] = dict(OPTIONS)
    alone, in_rounds = [], []
    retime, store = original.retime_original, original.store_original_latency
    monkeypatch.setattr(
        original, "retime_original", lambda ctx, deadline=None: alone.append(1) or retime(ctx, deadline)
    )
    monkeypatch.setattr(original, "store_original_latency", lambda ctx, t: in_rounds.append(len(t)) or store(ctx, t))
    quantune.tune(config, output=tmp_path / "run")
    # the original, timed beside the builds, is timed again once after them: in the ceilings' rounds
    # (each times it first) when they ran enough of them, else alone
    assert len(alone) + len(in_rounds) == 1 and all(n >= original.RETIME_ROUNDS for n in in_rounds)
    assert json.loads((tmp_path / "run" / "results.json").read_text())["trials"]
    log = (tmp_path / "run" / "workers" / "first_guess.log").read_text()
    assert "first guess: run set up in" in log and "ahead: run set up in" in log  # in the guess's worker, after it
    assert not (tmp_path / "run" / "workers" / "evaluate_ahead.log").exists()  # no worker of its own
    ahead = [json.loads(p.read_text())["value"] for p in (tmp_path / "c" / "evals").glob("*.json")]
    assert sum(1 for entry in ahead if entry.get("ahead")) == 2  # the first guess and its compute-only model


def _guess_in_budget(tmp_path: Path, monkeypatch: Any) -> dict[str, Any]:
    """A run with the engine's work ahead whose first guess is in budget: static_quant alone (several
    variants: ceilings to build), a loose criterion."""
    monkeypatch.setenv("QUANTUNE_PREBUILD", "1")
    config = _layernorm(tmp_path, "latency")
    config.update(executor={"kind": "process", "workers": 1}, stop={"max_trials": 3}, cache_dir=str(tmp_path / "c"))
    config["criterion"] = {"type": "relative", "tolerable_loss": 0.5}
    config["passes"] = [{"name": "static_quant", "search": True}]
    config["search"]["strategy_options"] = dict(OPTIONS)
    return config


def test_a_guess_in_budget_builds_the_ceilings_before_its_compute_only_model(
    make_config, tmp_path, monkeypatch
) -> None:
    """In budget, the guess's compute-only model is wanted only if the lighter stage finds it faster,
    after the ceilings: the guess's worker builds, in the first builder's place (no third process on
    two cores: a detector's ceilings waited 3 s after its first model in budget), and evaluates it
    only once the ceilings are timed (beside their timing it took a detector's rounds from 5 to
    11-17). The ceilings wait for those builds; every ceiling is built once."""
    config = _guess_in_budget(tmp_path, monkeypatch)
    quantune.tune(config, output=tmp_path / "run")
    workers = tmp_path / "run" / "workers"
    guess_log = (workers / "first_guess.log").read_text()
    assert "ahead: run set up in" in guess_log  # the compute-only model, evaluated after the builds ...
    went_on = re.search(r"ceilings timed at ([0-9.]+)", guess_log)
    log = (tmp_path / "run" / "quantune.log").read_text()
    timed = re.search(r"^(\S+ \S+) INFO quantune.strategy: speed ceilings: \d+ variants timed", log, re.M)
    assert went_on is not None and timed is not None
    ended = datetime.strptime(timed.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    assert float(went_on.group(1)) >= ended - 0.01  # ... once the ceilings were timed, not beside their timing
    assert not (workers / "ceiling_build.log").exists()  # the guess's worker built in its place
    built = re.search(r"speed ceilings built ahead: (\d+) of (\d+) variants", log)
    assert built is not None and built.group(1) == built.group(2) != "0"
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["trials"][0]["meets_criterion"] and results["trials"][0]["stage"].startswith("first guess")


def test_the_guess_s_worker_judges_its_guess_against_the_original(tmp_path: Path) -> None:
    """``in_budget``: the criterion on the guess's figures against the original's metric, cached with
    its outputs before it is timed (its figures come later); not known is not in budget (the worker
    then keeps its order)."""
    from quantune.config.loader import load_config
    from quantune.engine.executors.worker import WorkerSpec, runner_for
    from quantune.engine.measure.ahead import in_budget

    config = _layernorm(tmp_path, "latency")
    config["cache_dir"] = str(tmp_path / "c")
    spec = WorkerSpec(load_config(config), key="judge")
    runner = runner_for(spec)
    context = runner.context
    metric = context.evaluator.spec.metric
    assert not in_budget(spec, {metric: 1.0}, wait_s=0.0)  # the original's metric is not known yet
    assert not in_budget(spec, None, wait_s=0.0)  # the guess failed
    runner.baseline()
    original = context.cache.get_json("evals", context.eval_key(context.model.sha256))["metrics"][metric]
    sign = -1.0 if runner.criterion.higher_is_better else 1.0
    for loss, meets in ((0.0, True), (1.0, False)):  # the guess's metric as the original's, then far off
        assert in_budget(spec, {metric: original * (1.0 + sign * loss)}, wait_s=0.0) is meets
    # the original still being timed: its figures are not cached yet, its metric is (with its outputs)
    (context.cache.root / "evals" / f"{context.eval_key(context.model.sha256)}.json").unlink()
    assert in_budget(spec, {metric: original}, wait_s=0.0)
    assert not in_budget(spec, {metric: original * (1.0 + sign)}, wait_s=0.0)


def test_the_work_ahead_stops_before_the_confirmation_times(make_config, tmp_path, monkeypatch) -> None:
    """What the guess's worker still does when the search is over (evaluating its compute-only model
    ahead) is stopped before the confirmation times the answer side by side: beside that timing it
    is noise on the other core, and at the end of the run its stage took up to 0.5 s to notice."""
    from quantune.engine.measure.prebuild import Prebuild
    from quantune.engine.run.engine import Engine

    config = _guess_in_budget(tmp_path, monkeypatch)
    order: list[tuple[str, bool]] = []
    cancel, confirm = Prebuild.cancel, Engine._confirm

    def cancelled(self: Prebuild) -> None:
        cancel(self)
        order.append(("cancel", any(thread.is_alive() for thread in self._threads)))

    def confirmed(self: Engine, *args: Any, **kwargs: Any) -> Any:
        order.append(("confirm", False))
        return confirm(self, *args, **kwargs)

    monkeypatch.setattr(Prebuild, "cancel", cancelled)
    monkeypatch.setattr(Engine, "_confirm", confirmed)
    quantune.tune(config, output=tmp_path / "run")
    assert [step for step, _ in order][:2] == ["cancel", "confirm"], order
    assert order[0] == ("cancel", False)  # its workers are gone before the confirmation starts


def test_a_guess_in_budget_has_its_lighter_models_timed_in_the_ceilings_rounds(
    make_config, tmp_path, monkeypatch
) -> None:
    """The lighter stage times each lighter model against the guess right after the ceilings: two
    sessions of their own, each warming and timing the guess again (2.9 s of a detector's 12.8 s after
    its first model in budget). They go in the ceilings' rounds instead, each decided against the guess
    by the paired rule, and the lighter stage reads those answers: no session times such a pair again."""
    from quantune.evaluate.backend import LocalBackend

    config = _guess_in_budget(tmp_path, monkeypatch)
    sessions: list[tuple[str, list[str], list[tuple[int, int]]]] = []
    timed = LocalBackend.time

    def recorded(self: Any, request: Any) -> Any:
        if request.threshold is not None:  # rounds that stop once decided
            original, *candidates = request.models
            sessions.append((str(original), [str(c) for c in candidates], list(request.pairs)))
        return timed(self, request)

    monkeypatch.setattr(LocalBackend, "time", recorded)
    quantune.tune(config, output=tmp_path / "run")
    with_pairs = [entry for entry in sessions if entry[2]]
    assert len(with_pairs) == 1  # the ceilings' session, with the guess's two lighter models paired with it
    _, models, pairs = with_pairs[0]
    assert pairs and len({ref for _, ref in pairs}) == 1
    paired = {(models[ref - 1], models[row - 1]) for row, ref in pairs}  # rows count from 1 (0: the original)
    again = [(original, tuple(c)) for original, c, _ in sessions if len(c) == 1 and (original, c[0]) in paired]
    assert again == []  # the lighter stage read its answers: no pair timed a second time
    log = (tmp_path / "run" / "quantune.log").read_text()
    assert log.count("paired timing (in the speed ceilings' rounds)") == len(pairs)
