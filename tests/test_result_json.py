"""One criterion type from the config to results.json and back; results.json read back typed."""

from __future__ import annotations

import json

import pytest

import quantune
from quantune.cli import main
from quantune.engine.result import Result
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
