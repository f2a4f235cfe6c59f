"""Failures that teach: a failed trial's cause is classified, and points sharing it are not run."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Literal

import onnx
import optuna
import pytest

import quantune
from quantune import Categorical
from quantune.engine.executors import InProcessExecutor
from quantune.engine.run import engine as engine_module
from quantune.engine.run import loop as loop_module
from quantune.engine.trials.failures import KnownFailures, classify, normalise
from quantune.report.console import summary
from quantune.report.html import write_report
from quantune.search import Feedback, create_sampler
from quantune.space import SearchSpace
from quantune.strategy import WAIT, Proposal, Strategy, register_strategy

FRAGILE = "test_fragile"
CLASS = f"{FRAGILE}: ValueError: Expected <name> to be an initializer"
GOOD = {(mode, level) for mode in ("copy", "negate") for level in (1, 2, 3, 4)}
CALLS = {"count": 0, "interrupt_at": None}


class FragileConfig(quantune.PassConfig):
    mode: Literal["copy", "negate", "bad"] = "copy"
    level: int = 1


@quantune.register_pass
class FragilePass(quantune.Pass):
    """Copies the model (``negate``: with its last layer negated); ``bad`` fails the way a model
    with Constant weights fails dynamic quantization: naming a node that varies with ``level``."""

    name = FRAGILE
    Config = FragileConfig
    search_space = {"mode": Categorical(("copy", "negate", "bad"))}

    def run(self, config, model_in, model_out, context):
        CALLS["count"] += 1
        if CALLS["count"] == CALLS["interrupt_at"]:
            raise KeyboardInterrupt  # as a Ctrl-C landing while this pass runs
        if config.mode == "bad":
            raise ValueError(f"Expected conv{config.level * 7 + 150}.w_{config.level} to be an initializer")
        model = onnx.load(str(model_in))
        if config.mode == "negate":
            for node in model.graph.node:
                if node.op_type == "Gemm":
                    node.attribute.append(onnx.helper.make_attribute("alpha", -1.0))
        onnx.save(model, str(model_out))


@pytest.fixture(autouse=True)
def _reset_calls():
    CALLS.update(count=0, interrupt_at=None)


def fragile_config(make_config, tmp_path: Path, sampler: str, cache: str = "cache") -> dict:
    params = {"mode": {"search": ["bad", "copy", "negate"]}, "level": {"search": [1, 2, 3, 4]}}
    return make_config(
        [{"name": FRAGILE, "params": params}],
        objective="size",  # deterministic figures: runs compare exactly
        search={"sampler": sampler, "seed": 3},
        stop={"max_trials": 12},
        cache_dir=str(tmp_path / cache),
    )


def point(record) -> tuple[str, int]:
    return record.params[f"{FRAGILE}.mode"], record.params[f"{FRAGILE}.level"]


def sequence(result) -> list[tuple[tuple[str, int], str]]:
    return [(point(t), t.status) for t in sorted(result.trials, key=lambda t: t.number)]


@pytest.mark.parametrize("sampler", ["exhaustive", "tpe"])
def test_a_known_failure_is_not_run_again_and_the_rest_is_explored(make_config, tmp_path, sampler):
    config = fragile_config(make_config, tmp_path, sampler)
    out = tmp_path / "out"
    result = quantune.tune(config, output=out)

    failed = [t for t in result.trials if t.status == "failed"]
    assert failed and all(t.failure_class == CLASS for t in failed), [t.error for t in failed]
    assert len({t.error for t in failed}) == len(failed), "each failure names another node"
    assert len(failed) <= 3, [point(t) for t in failed]
    assert {point(t) for t in result.trials if t.status == "ok"} == GOOD, "every point that works must run"
    assert result.skipped_known_failures == 4 - len(failed), "every bad point either ran or was skipped"
    assert [t.number for t in sorted(result.trials, key=lambda t: t.number)] == list(range(len(result.trials)))

    saved = json.loads((out / "results.json").read_text())
    assert saved["failure_classes"] == {CLASS: len(failed)}
    assert saved["skipped_known_failures"] == result.skipped_known_failures
    assert all(t["failure_class"] == (CLASS if t["status"] == "failed" else None) for t in saved["trials"])
    assert f"{len(failed)} x {CLASS}" in summary(result), "the console's end summary lists the classes"
    assert html.escape(CLASS) in Path(write_report(out)).read_text()

    again = quantune.tune(config, output=tmp_path / "again")
    assert sequence(again) == sequence(result), "same config and seed: same trials in the same order"
    assert again.skipped_known_failures == result.skipped_known_failures


@pytest.mark.parametrize("sampler", ["exhaustive", "tpe"])
def test_a_resumed_run_skips_what_the_original_skipped(make_config, tmp_path, sampler):
    reference = quantune.tune(fragile_config(make_config, tmp_path, sampler, "ref-cache"), output=tmp_path / "ref")
    assert reference.skipped_known_failures > 0

    config = fragile_config(make_config, tmp_path, sampler)
    out = tmp_path / "out"
    CALLS.update(count=0, interrupt_at=len(reference.trials) - 1)  # Ctrl-C in the last trials, after a skip
    interrupted = quantune.tune(config, output=out)
    assert interrupted.interrupted
    finished = len(interrupted.trials)
    assert 0 < finished < len(reference.trials)

    CALLS.update(interrupt_at=None)
    resumed = quantune.tune(config, output=out)
    assert resumed.replayed == finished
    assert sequence(resumed) == sequence(reference)
    assert resumed.skipped_known_failures == reference.skipped_known_failures
    assert resumed.failure_classes == reference.failure_classes


@register_strategy("test_scripted")
class ScriptedStrategy(Strategy):
    """Waits at each barrier until its trials are told; a ``bad`` point's level depends on how
    many tells came before its ask, so asking it after another tell proposes another point."""

    script = ("bad", "barrier", "copy", "bad", "barrier", "negate")

    def bind(self, problem):
        super().bind(problem)
        self.step = self.pending = self.tells = 0

    def ask(self):
        while self.step < len(self.script):
            kind = self.script[self.step]
            if kind == "barrier":
                if self.pending:
                    return WAIT
                self.step += 1
                continue
            self.step += 1
            self.pending += 1
            level = 1 if kind != "bad" or self.tells <= 1 else 2
            return Proposal({f"{FRAGILE}.mode": kind, f"{FRAGILE}.level": level})
        return None

    def tell(self, proposal, outcome):
        self.pending -= 1
        self.tells += 1


class TwoAtOnce(InProcessExecutor):
    capacity = 2  # two trials in flight, each run when submitted: a deterministic parallel executor


def test_a_skip_between_a_trial_and_its_tell_is_replayed_at_the_same_moment(make_config, tmp_path, monkeypatch):
    """A skip followed by a wait for a running trial: the resumed run must make the skip before
    it tells that trial again, or the strategy proposes another point."""
    monkeypatch.setattr(engine_module, "create_executor", lambda config, spec, runner, out: TwoAtOnce(runner))

    def config(cache: str) -> dict:
        search = {"strategy": "test_scripted", "sampler": "random", "seed": 0}
        return {**fragile_config(make_config, tmp_path, "random", cache), "search": search}

    reference = quantune.tune(config("ref-cache"), output=tmp_path / "ref")
    assert sequence(reference) == [(("bad", 1), "failed"), (("copy", 1), "ok"), (("negate", 1), "ok")]
    assert reference.skipped_known_failures == 1

    CALLS.update(count=0, interrupt_at=3)  # Ctrl-C in the last trial, after the skip
    out = tmp_path / "out"
    assert quantune.tune(config("cache"), output=out).interrupted
    CALLS.update(interrupt_at=None)
    resumed = quantune.tune(config("cache"), output=out)
    assert resumed.replayed == 2
    assert sequence(resumed) == sequence(reference)
    assert resumed.skipped_known_failures == 1


def test_a_run_whose_every_proposal_shares_a_known_failure_stops(make_config, tmp_path, monkeypatch):
    monkeypatch.setattr(loop_module, "MAX_CONSECUTIVE_SKIPS", 3)
    params = {"mode": "bad", "level": {"search": list(range(1, 13))}}
    config = make_config([{"name": FRAGILE, "params": params}], stop={"max_trials": 12})
    result = quantune.tune(config, output=tmp_path / "out")
    assert len(result.trials) == 2, "two failures of one class tell that level plays no part"
    assert result.skipped_known_failures == 3
    assert result.stop_reason.startswith("every remaining point shares a known failure")


def test_classes_normalise_names_paths_and_numbers():
    a = classify("TrialError: pass 'dynamic_quant' failed: ValueError: Expected conv2d_157.w_0 to be an initializer")
    b = classify("TrialError: pass 'dynamic_quant' failed: ValueError: Expected linear_3.w_12 to be an initializer")
    assert a == b == "dynamic_quant: ValueError: Expected <name> to be an initializer"
    assert (
        classify(
            "TrialError: pass 'static_quant' failed: AttributeError: 'NoneType' object has no attribute 'data_type'"
        )
        == "static_quant: AttributeError: 'NoneType' object has no attribute 'data_type'"
    ), "names without digits (types, attributes) are the kind of error, not a varying part"
    load = "TrialError: onnxruntime cannot load the model: Load model from {} failed: node /blocks.{}/Conv: bad axis {}"
    assert classify(load.format("/tmp/a1/model.onnx", 3, 1)) == classify(load.format("/x/y/m.onnx", 11, 0))
    assert classify(load.format("/tmp/a/m.onnx", 3, 1)).startswith("evaluation: onnxruntime cannot load the model")
    assert classify("worker crashed: segmentation fault (SIGSEGV)") == "worker: crashed: segmentation fault (SIGSEGV)"
    assert classify("timeout: the trial ran longer than 30 s and was killed") == "worker: timeout"
    assert classify("out of memory (memory limit 800 MB): TrialError: pass 'x' failed: MemoryError") == (
        "worker: out of memory"
    )
    assert (
        classify("TrialError: pass 'static_quant' failed: MemoryError: std::bad_alloc") == "static_quant: out of memory"
    )
    assert normalise("shape (3, 224) at 0x7f3a2c and 1.5e-3\nsecond line") == "shape (<n>, <n>) at <addr> and <n>"
    assert classify("TrialError: pass 'a' failed: X: 1") != classify("TrialError: pass 'b' failed: X: 1")


def test_signatures_keep_only_shared_values_and_never_cover_a_point_that_ran():
    flow = ("q",)
    known = KnownFailures()
    known.learn(flow, {"q.a": 1, "q.b": 1}, "q: E")
    assert known.match(flow, {"q.a": 1, "q.b": 1}) == "q: E"
    assert known.match(flow, {"q.a": 1, "q.b": 2}) is None, "one failure says nothing of other values"
    known.learn(flow, {"q.a": 1, "q.b": 2}, "q: E")
    assert known.match(flow, {"q.a": 1, "q.b": 3}) == "q: E", "b differed between failures: not the cause"
    assert known.match(flow, {"q.a": 2, "q.b": 3}) is None
    known.learn(flow, {"q.a": 1, "q.b": 3}, None)  # ... yet a=1, b=3 ran: the cause is narrower
    assert known.match(flow, {"q.a": 1, "q.b": 4}) is None
    assert known.match(flow, {"q.a": 1, "q.b": 2}) == "q: E"
    # A pass that fails stops its flow there: later steps' values play no part, other flows' prefixes do.
    known.learn(("p", "q"), {"p.x": 0, "q.a": 5}, "p: F")
    assert known.match(("p", "q"), {"p.x": 0, "q.a": 6}) == "p: F"
    assert known.match(("p",), {"p.x": 0}) == "p: F"
    assert known.match(("r", "p"), {"p.x": 0}) is None
    # An evaluation failure is the whole flow's.
    known.learn(("p",), {"p.x": 1}, "evaluation: E")
    assert known.match(("p",), {"p.x": 1}) == "evaluation: E"
    assert known.match(("p", "q"), {"p.x": 1, "q.a": 0}) is None
    # A conditional parameter that one failure did not search is no part of the cause; a joint value
    # is the same as a tuple or (from the run store) a list.
    known.learn(("c",), {"c.t": "u8", "c.j": ("a", "b")}, "c: E")
    known.learn(("c",), {"c.t": "i8", "c.sym": True, "c.j": ["a", "b"]}, "c: E")
    assert known.match(("c",), {"c.t": "i8", "c.sym": False, "c.j": ("a", "b")}) == "c: E"
    assert known.match(("c",), {"c.t": "i8", "c.sym": False, "c.j": ("b", "b")}) is None


@pytest.mark.parametrize("name", ["tpe", "nsga2", "gp"])
def test_optuna_samplers_are_told_a_failure_as_the_worst_trial(name):
    if name == "gp":
        pytest.importorskip("torch")
    space = SearchSpace({"x": Categorical(tuple(range(8)))})
    sampler = create_sampler(name, seed=0)
    sampler.bind(space)
    first = sampler.ask()
    sampler.tell(first, Feedback(None))  # a failure before any value: held until there is one to compare
    second = sampler.ask()
    sampler.tell(second, Feedback(2.0, violation=0.3))
    third = sampler.ask()
    sampler.tell(third, Feedback(None))
    trials = sampler.study.trials
    assert [t.state for t in trials[:3]] == [optuna.trial.TrialState.COMPLETE] * 3, "no failure is left out"
    for trial in (trials[0], trials[2]):
        assert trial.value > 2.0
        assert sum(trial.constraints.values()) > 0.3
