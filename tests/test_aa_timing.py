"""A/A: the original timed against itself must never come out faster than itself.

A byte-identical copy of a tiny model, re-timed side by side with its original at the run's end,
came out faster beyond the noise: every round timed the original first, right after whatever the
process did between rounds (the settled rule's work, the loop's own), so the original alone paid
for it. A statistical assertion ("the copy is not faster") would be the natural test, yet even an
unbiased method calls an A/A pair faster now and then (its interval misses 1 at the rate its
confidence allows), so these tests assert what decides the outcome instead, which holds on any
machine at any speed: the order of the calls (every model leads, and takes every place, equally
often, also in the rounds right after the rule was asked), and the same-model answer of the
confirmation (ratio exactly 1, not faster) for a byte-identical copy under another file name.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

from conftest import build_mlp, mlp_inputs
from quantune.data import Dataset
from quantune.engine.measure.confirm import confirm_latency
from quantune.engine.outcome.verdict import KEEP_ORIGINAL, decide
from quantune.engine.trials.trial import TrialRecord
from quantune.evaluate import EvaluationSpec, Evaluator
from quantune.evaluate.latency import LatencySpec, TimingRequest, settle_now, time_side_by_side
from quantune.evaluate.rounds import time_until_decided


def _twins(tmp_path: Path, count: int) -> list[Path]:
    """``count`` models computing the same, told apart only by their doc string (which a session
    reports as its description) and, but for the original, a node's name."""
    original = onnx.load(str(build_mlp(tmp_path / "original.onnx")))
    paths = []
    for index in range(count):
        model = onnx.ModelProto()
        model.CopyFrom(original)
        model.doc_string = str(index)
        if index:
            model.graph.node[0].name = f"renamed{index}"
        paths.append(tmp_path / f"twin{index}.onnx")
        onnx.save(model, str(paths[-1]))
    return paths


def _recorder(calls: list[int]):  # a runner: (session, feeds) -> outputs, noting which model ran
    def runner(session, feeds):
        calls.append(int(session.get_modelmeta().description))
        return [session.run(None, feed) for feed in feeds]

    return runner


def test_every_model_leads_the_rounds_alike_even_right_after_the_rule_is_asked(tmp_path: Path) -> None:
    """Three twins, 30 rounds, a settled rule asked (and answering "go on") as the confirmation's is:
    in each block of three rounds every model runs once in every place, and the rounds right after
    the rule was asked are not all led by one model. Before, the original led every round."""
    models = _twins(tmp_path, 3)
    calls: list[int] = []
    asked: list[int] = []

    def go_on(timings: np.ndarray) -> bool:
        asked.append(timings.shape[1])
        return False

    spec = LatencySpec(warmup=1, repeats=30, threads=1)
    feeds = {"x": mlp_inputs(1, 0)}
    timings = time_side_by_side(models, feeds, spec, runner=_recorder(calls), settled=go_on)
    assert timings.shape == (3, 30) and asked == [done for done in range(1, 31) if settle_now(done)]
    rounds = np.array(calls[3:]).reshape(30, 3)  # after one warm-up call each: the rounds, in call order
    for block in range(10):
        places = rounds[3 * block : 3 * block + 3]
        assert all(sorted(places[:, place]) == [0, 1, 2] for place in range(3)), places
    after_rule = Counter(rounds[done, 0] for done in asked if done < 30)
    assert len(after_rule) > 1 and max(after_rule.values()) < sum(after_rule.values()), after_rule


def test_the_rounds_that_stop_once_decided_vary_their_order_too(tmp_path: Path) -> None:
    """The search's paired timings and the ceilings (rounds that stop once decided): in the first
    block of rounds, which every model runs, each model leads once."""
    models = _twins(tmp_path, 3)
    calls: list[int] = []
    spec = LatencySpec(warmup=1, repeats=10, threads=1)
    feeds = {"x": mlp_inputs(1, 0)}
    time_until_decided(TimingRequest(tuple(models), feeds, spec, _recorder(calls), threshold=0.98, min_rounds=5))
    first = np.array(calls[3:12]).reshape(3, 3)
    assert sorted(first[:, 0]) == [0, 1, 2], first


def _record(number: int, model: Path, flow: str = "dynamic_quant") -> TrialRecord:
    return TrialRecord(
        number=number,
        flow=[flow],
        params={},
        status="ok",
        metrics={"cosine": 1.0, "latency_ms": 0.01, "size_bytes": 1.0, "quantized_ops": 3},
        meets_criterion=True,
        accuracy_loss=0.0,
        objective=0.01,
        model_path=str(model),
    )


def test_a_byte_identical_copy_is_the_original_not_faster(tmp_path: Path) -> None:
    """A candidate whose model is the original's bytes under another file name is the same model: its
    paired ratio is exactly 1 (as the search's paired timing answers for such a pair), the verdict
    keeps the original. A twin that differs in a node's name is no copy: it gets a measured ratio."""
    original = build_mlp(tmp_path / "original.onnx")
    copy = tmp_path / "cache" / "candidate.onnx"
    copy.parent.mkdir()
    shutil.copyfile(original, copy)
    renamed = onnx.load(str(original))
    renamed.graph.node[0].name = "renamed"
    twin = tmp_path / "twin.onnx"
    onnx.save(renamed, str(twin))
    evaluator = Evaluator(
        EvaluationSpec(metric="cosine", batch_size=1, latency=LatencySpec(warmup=1, repeats=10)),
        Dataset({"x": mlp_inputs(4, 0)}, "t"),
        ["x"],
    )
    records = [_record(1, copy), _record(2, twin, "static_quant")]  # two flows: two contenders
    baseline = {"latency_ms": 0.01, "size_bytes": 1.0}
    confirmation = confirm_latency(evaluator, original, baseline, records, 2)
    assert confirmation is not None and confirmation.rounds >= 5
    same = confirmation.ratios[1]
    assert (same.median, same.low, same.high) == (1.0, 1.0, 1.0) and not same.faster and not same.undecided
    assert confirmation.ratios[2].low < confirmation.ratios[2].high  # measured, not taken as the same model
    alone = confirm_latency(evaluator, original, baseline, [_record(1, copy)], 1)
    assert alone is not None
    verdict = decide([_record(1, copy)], ["latency"], baseline, confirmation=alone)
    assert verdict.kind == KEEP_ORIGINAL, verdict.reason


def test_a_targets_rounds_follow_the_same_order_as_here_across_its_batches(tmp_path: Path) -> None:
    """A target's server times in batches (the settled rule is asked between them): its rounds go on
    in the order of the local ones, batch after batch, rather than starting again at the first
    round's order with each batch (the original then led every batch's first round). The same
    runner notes the calls here and there; the two sequences are the same."""
    import sys

    from quantune.evaluate import TargetBackend

    models = _twins(tmp_path, 3)
    log = tmp_path / "calls.txt"
    runner = tmp_path / "recording_runner.py"
    runner.write_text(
        "def run(session, feeds):\n"
        f"    with open({str(log)!r}, 'a') as out:\n"
        "        out.write(session.get_modelmeta().description + '\\n')\n"
        "    return [session.run(None, feed) for feed in feeds]\n"
    )
    spec = LatencySpec(warmup=1, repeats=19, threads=1)
    feeds = {"x": mlp_inputs(1, 0)}
    here: list[int] = []
    time_side_by_side(models, feeds, spec, runner=_recorder(here), settled=lambda _: False)
    backend = TargetBackend(sys.executable, runner=f"{runner}:run")
    try:
        there = backend.time(TimingRequest(tuple(models), feeds, spec, settled=lambda _: False))
    finally:
        backend.close()
    assert there.shape == (3, 19)
    calls = [int(line) for line in log.read_text().split()]
    assert calls == here  # warm-up, then 10 rounds and three batches of 3 rounds: the same order
    rounds = np.array(calls[3:]).reshape(19, 3)  # after one warm-up call each
    for block in range(6):  # blocks 4 and 5 span the batches (rounds 10-12, 13-15)
        places = rounds[3 * block : 3 * block + 3]
        assert all(sorted(places[:, place]) == [0, 1, 2] for place in range(3)), places
