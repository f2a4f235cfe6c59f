"""Where the cache disagrees with the run store, the run store wins: a trial whose model left
the cache runs again, or the run stops with one line; best/ always matches results.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import quantune
from quantune.store import RunStore

SEARCH = [{"name": "static_quant", "params": {"quant_format": "QOperator", "per_channel": {"search": [False, True]}}}]


def best_pair_matches(out: Path) -> None:
    saved = json.loads((out / "results.json").read_text())
    assert saved["verdict"] == "improved"
    params = json.loads((out / "best" / "params.json").read_text())
    assert params["trial"] == saved["best"]["number"]
    assert (out / "best" / "model.onnx").read_bytes() == Path(saved["best"]["model_path"]).read_bytes()


class ClearsTheCache:
    """Deletes the whole cache folder after each finished trial (as a user's `rm -rf` would)."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache

    def on_start(self, max_trials, baseline) -> None:
        pass

    def on_trial(self, record, status) -> None:
        shutil.rmtree(self.cache, ignore_errors=True)

    def on_end(self, result) -> None:
        pass


def test_a_cache_cleared_between_runs_reruns_the_trials_whose_models_are_gone(make_config, tmp_path, capsys):
    config = make_config(SEARCH, objective="size")
    out = tmp_path / "out"
    first = quantune.tune(config, output=out)
    assert first.verdict == "improved" and len(first.trials) == 2
    shutil.rmtree(tmp_path / "cache")
    capsys.readouterr()

    second = quantune.tune(config, output=out)
    assert "2 finished trial(s) run again: their models are no longer in the cache" in capsys.readouterr().err
    assert second.replayed == 0, "no record whose model is gone stands in for a trial"
    assert all(Path(t.model_path).is_file() for t in second.trials)
    best_pair_matches(out)
    assert second.best.number == first.best.number and second.best.model_sha256 == first.best.model_sha256
    assert second.best.metrics["size_bytes"] == first.best.metrics["size_bytes"], "the same model, rebuilt"


def test_a_chosen_model_that_left_the_cache_during_the_run_is_built_again(make_config, tmp_path, capsys):
    """A cache miss rebuilds: the best's model, gone from the cache, is built again through the
    passes (the same bytes) and best/ is written as always."""
    config = make_config(SEARCH, objective="size")
    out = tmp_path / "out"
    result = quantune.tune(config, output=out, listeners=[ClearsTheCache(tmp_path / "cache")])
    assert result.model_not_saved is None and result.best_model_path is not None
    best_pair_matches(out)
    assert "left the cache during the run (cache_dir cleared?)" in capsys.readouterr().err  # the others' loss


def test_a_chosen_model_that_cannot_be_built_again_is_said_in_one_line_and_the_next_run_mends_it(
    make_config, tmp_path, capsys, monkeypatch
):
    from quantune.engine.trials.runner import TrialRunner

    monkeypatch.setattr(TrialRunner, "rebuild", lambda self, record: None)  # not the same bytes, say
    config = make_config(SEARCH, objective="size")
    out = tmp_path / "out"
    lost = quantune.tune(config, output=out, listeners=[ClearsTheCache(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert lost.best_model_path is None and not (out / "best").exists(), "no best/ without its model"
    saved = json.loads((out / "results.json").read_text())  # the run's record is kept, and says why
    assert saved["model_not_saved"] and "best/ is not written" in saved["model_not_saved"]
    said = [line for line in err.splitlines() if "best/ is not written" in line]
    assert len(said) == 1 and "run the same command again" in said[0]
    assert err.index("left the cache during the run (cache_dir cleared?)") < err.index(said[0])

    monkeypatch.undo()
    mended = quantune.tune(config, output=out)
    assert mended.replayed == 0 and mended.verdict == "improved"
    best_pair_matches(out)


def test_trials_after_the_cache_was_deleted_still_run(make_config, tmp_path):
    """The cache's folders are made again as entries are put: only the models lost are lost."""
    config = make_config(SEARCH, objective="size", executor={"kind": "process", "workers": 1})
    out = tmp_path / "out"
    result = quantune.tune(config, output=out, listeners=[ClearsTheCache(tmp_path / "cache")])
    assert result.model_not_saved is None, "the best's model went too, and was built again"
    store = RunStore(out / "run.db")
    trials = store.trials()
    store.close()
    assert len(trials) == 2 and all(t["status"] == "ok" for t in trials), [t["error"] for t in trials]
