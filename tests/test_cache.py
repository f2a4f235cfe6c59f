"""The content-addressed artifact cache, and cache hits across whole runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import quantune
from conftest import build_cnn
from quantune.model import file_sha256
from quantune.store import ArtifactCache, cache_key, default_cache_dir


def put_model_copy(cache: ArtifactCache, key: str, source: Path, meta: dict | None = None) -> tuple[Path, str]:
    work_dir = cache.new_work_dir()
    shutil.copyfile(source, work_dir / "model.onnx")
    return cache.put_model(key, work_dir, meta or {"pass": "test"})


# -- models ---------------------------------------------------------------------------------------


def test_model_round_trip(tmp_path, cnn_model):
    cache = ArtifactCache(tmp_path / "cache")
    key = cache_key("pass", "test", 1)
    assert cache.get_model(key) is None
    stored, sha = put_model_copy(cache, key, cnn_model)
    assert sha == file_sha256(cnn_model)
    assert stored.read_bytes() == cnn_model.read_bytes()
    assert stored.parent != cnn_model.parent
    found = cache.get_model(key)
    assert found is not None
    path, found_sha = found
    assert path == stored and found_sha == sha
    assert path.read_bytes() == cnn_model.read_bytes()
    # The scratch folder was moved into place, not copied and left behind.
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


def test_put_model_records_meta(tmp_path, cnn_model):
    cache = ArtifactCache(tmp_path / "cache")
    stored, sha = put_model_copy(cache, "k", cnn_model, {"pass": "graph_opt", "config": {"level": "all"}})
    meta = json.loads((stored.parent / "meta.json").read_text())
    assert meta["pass"] == "graph_opt" and meta["config"] == {"level": "all"} and meta["sha256"] == sha


def test_corrupted_model_is_detected_and_dropped(tmp_path, cnn_model):
    cache = ArtifactCache(tmp_path / "cache")
    stored, _ = put_model_copy(cache, "key", cnn_model)
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stored.write_bytes(bytes(data))
    assert cache.get_model("key") is None
    assert not stored.parent.exists(), "a corrupt entry must be removed"
    assert cache.get_model("key") is None
    # The entry can be written again afterwards.
    put_model_copy(cache, "key", cnn_model)
    assert cache.get_model("key") is not None


def test_truncated_model_and_broken_meta_are_dropped(tmp_path, cnn_model):
    cache = ArtifactCache(tmp_path / "cache")
    stored, _ = put_model_copy(cache, "a", cnn_model)
    stored.write_bytes(stored.read_bytes()[:100])
    assert cache.get_model("a") is None
    stored, _ = put_model_copy(cache, "b", cnn_model)
    (stored.parent / "meta.json").write_text("{not json")
    assert cache.get_model("b") is None
    assert not stored.parent.exists()


def test_model_entry_missing_its_model_is_a_miss(tmp_path, cnn_model):
    cache = ArtifactCache(tmp_path / "cache")
    stored, _ = put_model_copy(cache, "k", cnn_model)
    stored.unlink()
    assert cache.get_model("k") is None


def test_put_model_keeps_an_entry_another_worker_put_first(tmp_path, cnn_model, mlp_model):
    # Two workers that miss on the same key both run the pass; the second must not replace the
    # first's entry, which the first worker's next pass may be reading at that moment.
    cache = ArtifactCache(tmp_path / "cache")
    first, first_sha = put_model_copy(cache, "k", cnn_model)
    inode = first.stat().st_ino
    work_dir = cache.new_work_dir()
    shutil.copyfile(mlp_model, work_dir / "model.onnx")
    second, second_sha = cache.put_model("k", work_dir, {"pass": "test"})
    assert (second, second_sha) == (first, first_sha) == (first, file_sha256(cnn_model))
    assert first.stat().st_ino == inode, "the entry in use was replaced"
    assert not work_dir.exists(), "the losing worker's folder must be cleaned up"


def test_put_model_replaces_a_partial_entry(tmp_path, cnn_model, mlp_model):
    cache = ArtifactCache(tmp_path / "cache")
    stored, _ = put_model_copy(cache, "k", cnn_model)
    (stored.parent / "meta.json").unlink()  # a crash between writing the model and its meta
    _, sha = put_model_copy(cache, "k", mlp_model)
    path, found_sha = cache.get_model("k")
    assert found_sha == sha == file_sha256(mlp_model)
    assert path.read_bytes() == mlp_model.read_bytes()


# -- json and arrays ------------------------------------------------------------------------------


def test_json_round_trip(tmp_path):
    cache = ArtifactCache(tmp_path / "cache")
    value = {"metrics": {"top1": 0.75, "latency_ms": 1.5}, "nested": [1, "two", None]}
    assert cache.get_json("evals", "k") is None
    cache.put_json("evals", "k", value)
    assert cache.get_json("evals", "k") == value
    assert cache.get_json("evals", "other") is None


def test_corrupted_json_is_dropped(tmp_path):
    cache = ArtifactCache(tmp_path / "cache")
    cache.put_json("evals", "k", {"a": 1})
    (tmp_path / "cache" / "evals" / "k.json").write_text('{"a": ')
    assert cache.get_json("evals", "k") is None
    assert not (tmp_path / "cache" / "evals" / "k.json").exists()


def test_arrays_round_trip(tmp_path):
    cache = ArtifactCache(tmp_path / "cache")
    arrays = {
        "logits": np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32),
        "ids": np.arange(5, dtype=np.int64),
    }
    assert cache.get_arrays("k") is None
    cache.put_arrays("k", arrays)
    loaded = cache.get_arrays("k")
    assert set(loaded) == set(arrays)
    for name, array in arrays.items():
        assert loaded[name].dtype == array.dtype
        np.testing.assert_array_equal(loaded[name], array)


def test_corrupted_arrays_are_dropped(tmp_path):
    cache = ArtifactCache(tmp_path / "cache")
    cache.put_arrays("k", {"a": np.zeros(4)})
    path = tmp_path / "cache" / "outputs" / "k.npz"
    path.write_bytes(b"not a zip archive")
    assert cache.get_arrays("k") is None
    assert not path.exists()


def test_no_temporary_files_are_left_after_writes(tmp_path):
    cache = ArtifactCache(tmp_path / "cache")
    cache.put_json("evals", "k", {"a": 1})
    cache.put_arrays("k", {"a": np.zeros(2)})
    assert sorted(p.name for p in (tmp_path / "cache" / "evals").iterdir()) == ["k.json"]
    assert sorted(p.name for p in (tmp_path / "cache" / "outputs").iterdir()) == ["k.npz"]


# -- keys -----------------------------------------------------------------------------------------

BASE_PARTS = ("pass", "static_quant", 1, "ab" * 32, {"quant_format": "QDQ", "per_channel": False}, "fp", 16)


def test_cache_key_is_a_stable_sha256():
    key = cache_key(*BASE_PARTS)
    assert len(key) == 64 and int(key, 16) >= 0
    assert cache_key(*BASE_PARTS) == key
    reordered = (*BASE_PARTS[:4], {"per_channel": False, "quant_format": "QDQ"}, *BASE_PARTS[5:])
    assert cache_key(*reordered) == key, "dict order must not matter"


def test_cache_key_is_the_same_in_another_process():
    code = "import sys, json; from quantune.store import cache_key; print(cache_key(*json.loads(sys.argv[1])))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    parts = json.dumps(list(BASE_PARTS))
    other = subprocess.run(
        [sys.executable, "-c", code, parts], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()
    assert other == cache_key(*BASE_PARTS)


@pytest.mark.parametrize(
    ("index", "changed"),
    [
        (0, "eval"),
        (1, "dynamic_quant"),
        (2, 2),
        (3, "cd" * 32),
        (4, {"quant_format": "QOperator", "per_channel": False}),
        (4, {"quant_format": "QDQ", "per_channel": True}),
        (4, {"quant_format": "QDQ", "per_channel": False, "reduce_range": True}),
        (5, "other-fingerprint"),
        (5, None),
        (6, 32),
    ],
)
def test_cache_key_changes_with_each_part(index, changed):
    parts = list(BASE_PARTS)
    parts[index] = changed
    assert cache_key(*parts) != cache_key(*BASE_PARTS)


def test_cache_key_distinguishes_types_and_arity():
    assert cache_key(1) != cache_key("1")
    assert cache_key(1) != cache_key(1.5)
    assert cache_key(True) != cache_key(1)
    assert cache_key(None) != cache_key("None")
    assert cache_key("a", "b") != cache_key("ab")
    assert cache_key("a") != cache_key("a", None)


def test_default_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("QUANTUNE_CACHE_DIR", str(tmp_path / "here"))
    assert default_cache_dir() == tmp_path / "here"
    monkeypatch.delenv("QUANTUNE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "quantune"


# -- whole runs -----------------------------------------------------------------------------------


def static_search_config(make_config, **overrides):
    passes = [
        {
            "name": "static_quant",
            "params": {
                "quant_format": {"search": ["QDQ", "QOperator"]},
                "activation_type": {"search": ["uint8", "int8"]},
            },
        }
    ]
    # Caching is about the search's own figures: no end-of-run latency re-timing here (test_confirm.py).
    overrides.setdefault(
        "evaluation", {"metric": "top1", "latency": {"warmup": 1, "repeats": 3, "threads": 1, "confirm_top": 0}}
    )
    return make_config(passes, **overrides)


def assert_all_hits_the_second_time(first, second, first_json, second_json) -> None:
    assert len(first.trials) == 4
    assert all(trial.status == "ok" for trial in first.trials)
    assert all(set(trial.cache.values()) == {"miss"} for trial in first.trials)
    assert [t.params for t in second.trials] == [t.params for t in first.trials]
    assert [t.number for t in second.trials] == [t.number for t in first.trials]
    assert [t.metrics for t in second.trials] == [t.metrics for t in first.trials]
    assert second.baseline == first.baseline
    assert first_json["cache"]["baseline"] == {"hits": 0, "misses": 1}
    assert first_json["cache"]["static_quant"] == {"hits": 0, "misses": 4}
    assert [t["params"] for t in second_json["trials"]] == [t["params"] for t in first_json["trials"]]
    for trial in second.trials:
        assert trial.cache == {"static_quant": "hit", "evaluation": "hit"}
    assert [t["cache"] for t in second_json["trials"]] == [{"static_quant": "hit", "evaluation": "hit"}] * 4
    assert second_json["cache"]["baseline"] == {"hits": 1, "misses": 0}
    assert second_json["cache"]["static_quant"] == {"hits": 4, "misses": 0}
    assert second_json["cache"]["evaluation"] == {"hits": 4, "misses": 0}


@pytest.mark.parametrize("sampler", ["exhaustive", "tpe"])
def test_second_run_in_another_folder_is_all_cache_hits(sampler, make_config, tmp_path):
    config = static_search_config(make_config, search={"sampler": sampler, "seed": 0})
    first = quantune.tune(config, output=tmp_path / "a")
    second = quantune.tune(config, output=tmp_path / "b")
    assert_all_hits_the_second_time(
        first,
        second,
        json.loads((tmp_path / "a" / "results.json").read_text()),
        json.loads((tmp_path / "b" / "results.json").read_text()),
    )


@pytest.mark.parametrize("sampler", ["exhaustive", "tpe"])
def test_second_run_in_the_same_folder_resumes_and_computes_nothing(sampler, make_config, tmp_path):
    """The same config in the same folder resumes: every finished trial is taken from the run
    store, so this run does no pass or evaluation work and its cache stats count none."""
    config = static_search_config(make_config, search={"sampler": sampler, "seed": 0})
    first = quantune.tune(config, output=tmp_path / "out")
    second = quantune.tune(config, output=tmp_path / "out")
    second_json = json.loads((tmp_path / "out" / "results.json").read_text())
    assert second.replayed == len(first.trials) == second_json["replayed_trials"]
    assert [(t.number, t.params, t.metrics) for t in second.trials] == [
        (t.number, t.params, t.metrics) for t in first.trials
    ]
    assert all(set(stats) == {"hits", "misses"} for stats in second_json["cache"].values())
    assert sum(stats["misses"] for name, stats in second_json["cache"].items() if name != "baseline") == 0
    assert second_json["cache"]["baseline"] == {"hits": 1, "misses": 0}


def test_changed_calibration_data_misses_the_pass_cache(make_config, tmp_path, cnn_data):
    config = static_search_config(make_config)
    quantune.tune(config, output=tmp_path / "a")
    other = tmp_path / "calib-other.npz"
    with np.load(cnn_data["calibration"]) as archive:
        np.savez(other, input=archive["input"] * 2.0)
    changed = static_search_config(make_config)
    changed["data"]["calibration"] = str(other)
    result = quantune.tune(changed, output=tmp_path / "b")
    assert all(trial.cache["static_quant"] == "miss" for trial in result.trials)


def test_changed_model_misses_every_cache(make_config, tmp_path):
    config = static_search_config(make_config)
    quantune.tune(config, output=tmp_path / "a")
    other = build_cnn(tmp_path / "other.onnx", seed=99)
    changed = static_search_config(make_config, model=str(other))
    result = quantune.tune(changed, output=tmp_path / "b")
    assert result.cache_stats["baseline"] == {"hits": 0, "misses": 1}
    assert all(set(trial.cache.values()) == {"miss"} for trial in result.trials)


def test_changed_latency_settings_miss_only_the_evaluation_cache(make_config, tmp_path):
    config = static_search_config(make_config)
    quantune.tune(config, output=tmp_path / "a")
    changed = static_search_config(
        make_config, evaluation={"metric": "top1", "latency": {"warmup": 0, "repeats": 2, "threads": 1}}
    )
    result = quantune.tune(changed, output=tmp_path / "b")
    assert all(trial.cache == {"static_quant": "hit", "evaluation": "miss"} for trial in result.trials)


def test_corrupted_cache_entry_is_recomputed_in_a_run(make_config, tmp_path):
    config = static_search_config(make_config)
    first = quantune.tune(config, output=tmp_path / "a")
    victim = Path(first.trials[0].model_path)
    victim.write_bytes(victim.read_bytes() + b"\0")
    again = quantune.tune(config, output=tmp_path / "b")
    assert again.trials[0].cache["static_quant"] == "miss"
    assert all(trial.cache["static_quant"] == "hit" for trial in again.trials[1:])
    assert Path(again.trials[0].model_path).is_file()
    assert again.trials[0].status == "ok"


def test_changed_metric_script_is_not_served_from_the_cache(make_config, tmp_path, monkeypatch):
    script = tmp_path / "metric.py"
    script.write_text("def score(outputs, data):\n    return 0.25\n")
    config = make_config(
        evaluation={"metric": f"{script}:score", "latency": {"warmup": 1, "repeats": 3}},
        criterion={"type": "absolute", "tolerable_loss": 1.0},
    )
    first = quantune.tune(config, output=tmp_path / "out")
    assert first.baseline[f"{script}:score"] == 0.25
    script.write_text("def score(outputs, data):\n    return 0.75\n")
    # A new process would import the script afresh; emulate that.
    for name in [name for name in sys.modules if name.startswith("quantune_user_")]:
        monkeypatch.delitem(sys.modules, name)
    second = quantune.tune(config, output=tmp_path / "out2")
    assert second.baseline[f"{script}:score"] == 0.75
