"""Two settings that produce the byte-identical model are one candidate, not two trials of the budget."""

from __future__ import annotations

from pathlib import Path

import quantune
from quantune.engine import RunStatus


def test_identical_models_are_duplicates_not_trials(make_config, tmp_path: Path) -> None:
    # 64 calibration rows: 64, 128 and 256 samples all calibrate on the same 64 rows -> one model.
    passes = [
        {
            "name": "static_quant",
            "params": {"calibration_samples": {"search": [64, 128, 256]}},
        }
    ]
    config = make_config(passes, stop={"max_trials": 2})
    counts: list[int] = []

    class Counts:  # what a progress display is told after each trial
        def on_start(self, max_trials: int | None, baseline: dict[str, float]) -> None: ...
        def on_trial(self, record: object, status: RunStatus) -> None:
            counts.append(status.done)

        def on_end(self, result: object) -> None: ...

    result = quantune.tune(config, output=tmp_path / "run", listeners=[Counts()])
    trials = sorted(result.trials, key=lambda t: t.number)
    shas = [t.model_sha256 for t in trials]
    assert all(shas), "every ok trial records its model's hash"
    firsts: dict[str, int] = {}
    for trial in trials:
        first = firsts.setdefault(trial.model_sha256, trial.number)
        if first != trial.number:
            assert f"duplicate of trial {first}" in trial.stage
            assert trial.cache.get("evaluation") == "hit"  # never evaluated again
        else:
            assert "duplicate" not in trial.stage
    assert len(set(shas)) == 1
    assert len(trials) == 3, "max_trials (2) counts distinct models only: all three settings ran"
    assert counts[-1] == len(set(shas)), counts  # the display counts as max_trials does, duplicates apart
