"""One criterion type from the config to results.json and back; results.json read back typed."""

from __future__ import annotations

import json

import pytest

import quantune
from quantune.cli import main
from quantune.engine.outcome.result import Result
from quantune.evaluate.criterion import Criterion
from quantune.report.miss import budget_value


@pytest.mark.parametrize(
    "criterion",
    [
        Criterion("relative", 0.01),
        Criterion("relative", 0.05, higher_is_better=False),
        Criterion("absolute", 0.5),
        Criterion("absolute", 2.0, higher_is_better=False),
    ],
)
def test_the_worst_accepted_value_is_where_the_criterion_flips(criterion: Criterion) -> None:
    """``budget_value`` (the closest miss's "budget") is the criterion's own edge, not a copy of its rule."""
    baseline = 0.8
    edge = criterion.worst_accepted(baseline)
    worse = edge - 1e-6 if criterion.higher_is_better else edge + 1e-6
    assert criterion.check(baseline, edge).meets
    assert not criterion.check(baseline, worse).meets


def test_the_criterion_reads_back_what_it_writes_and_old_files() -> None:
    criterion = Criterion("relative", 0.02, higher_is_better=False)
    written = criterion.to_json()
    assert list(written) == ["type", "tolerable_loss", "higher_is_better", "description"]  # the on-disk keys
    assert Criterion.from_json(json.loads(json.dumps(written))) == criterion
    old = Criterion.from_json({"type": "absolute", "tolerable_loss": 1})  # the first results.json files
    assert old == Criterion("absolute", 1.0) and old.higher_is_better is True


def test_results_json_reads_back_typed(make_config, tmp_path) -> None:
    out = tmp_path / "out"
    config = make_config(criterion={"type": "absolute", "tolerable_loss": 0.0}, stop={"max_trials": 2})
    result = quantune.tune(config, output=out)
    data = json.loads((out / "results.json").read_text())
    assert data["criterion"] == {
        "type": "absolute",
        "tolerable_loss": 0.0,
        "higher_is_better": result.criterion.higher_is_better,
        "description": result.criterion.describe(),
    }
    again = Result.from_json(data, out)
    assert again.criterion == result.criterion and isinstance(again.criterion, Criterion)
    assert [t.number for t in again.trials] == [t.number for t in result.trials]
    assert json.loads(json.dumps(again.to_dict())) == data  # nothing lost or changed on the way back
    assert budget_value(again) == budget_value(result)


def test_report_refuses_a_results_json_without_a_criterion_in_one_line(make_config, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    quantune.tune(make_config(stop={"max_trials": 1}), output=out)
    data = json.loads((out / "results.json").read_text())
    del data["criterion"]
    (out / "results.json").write_text(json.dumps(data))
    assert main(["report", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "criterion" in err[0]


def test_the_report_draws_an_old_results_json_read_back_typed(tmp_path) -> None:
    """The page reads the typed Result: a results.json of the first kind (no objective, objectives,
    environment, time breakdown or strategy notes; a criterion without its description; trials
    with only their first keys) still draws, each missing key at its default."""
    from quantune.report.html import render_html

    def trial(number: int, status: str, loss: float | None, latency: float) -> dict[str, object]:
        metrics = {"top1": 0.9, "latency_ms": latency, "size_bytes": 2048.0} if status == "ok" else {}
        meets = loss is not None and loss <= 0.01
        params = {"static_quant.per_channel": number % 2 == 0}
        first = {"number": number, "flow": ["static_quant"], "params": params, "status": status, "metrics": metrics}
        return {**first, "accuracy_loss": loss, "meets_criterion": meets}

    trials = [trial(0, "ok", 0.0, 1.0), trial(1, "ok", 0.02, 0.5), trial(2, "failed", None, 0.0)]
    old = {
        "baseline": {"top1": 0.9, "latency_ms": 2.0, "size_bytes": 4096.0},
        "trials": trials,
        "best": trials[0],
        "metric": "top1",
        "criterion": {"type": "absolute", "tolerable_loss": 0.01},
        "verdict": "improved",
    }
    result = Result.from_json(old, tmp_path)
    assert result.objective == "latency" and result.environment == {} and result.failure_classes == {"unclassified": 1}
    page = render_html(old, tmp_path)
    assert page == render_html(result, tmp_path)  # the dict is read with Result.from_json, so the same page
    assert "quantune: top1, 3 trials" in page and "best: trial 0" in page
    # the failure classes are the typed Result's, counted from the trials (main read the key, absent here)
    assert "predates the machine record" in page and "failed 1x: unclassified" in page
