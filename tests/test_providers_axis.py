"""``target.providers``: the execution provider as a search axis, on tiny built models.

Real parts only: onnxruntime quantizes and runs; OpenVINO's provider comes from the real
target environment (``target_env.py``) and its tests skip, saying why, where it cannot be made.
No provider is faked: one this machine lacks is skipped with its reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import quantune
from conftest import cnn_inputs
from quantune.config import load_config
from quantune.engine.plan.plan import build_plan
from quantune.engine.plan.providers import resolve_providers, with_provider_axis
from quantune.errors import ConfigError
from quantune.evaluate.backend import LocalBackend
from quantune.evaluate.session_file import read_session_settings
from quantune.evaluate.target_backend import TargetBackend
from quantune.passes import get_pass
from quantune.space.providers import refusal

CPU, OV = "CPUExecutionProvider", "OpenVINOExecutionProvider"
DIGITS = Path(__file__).resolve().parents[1] / "examples" / "digits"


def provider_config(make_config, providers: Any = None, **target: Any) -> dict[str, Any]:
    """Static QDQ/QOperator and dynamic quantization of the tiny CNN, in two flows."""
    passes = [
        {"name": "static_quant", "params": {"quant_format": {"search": ["QDQ", "QOperator"]}, "per_channel": False}},
        {"name": "dynamic_quant"},
    ]
    config = make_config(passes, flows=[["static_quant"], ["dynamic_quant"]])
    config["evaluation"]["latency"]["confirm_top"] = 0
    config["target"] = {**target, **({"providers": providers} if providers is not None else {})}
    return config


def axis_plan(make_config, providers: list[str]):
    """The plan of a config whose provider step names ``providers`` (as with_provider_axis writes it)."""
    config = provider_config(make_config)
    config["passes"].append(
        {"name": "execution_provider", "id": "provider", "params": {"provider": {"search": providers}}}
    )
    return build_plan(load_config(config).config)


def test_the_provider_is_a_dimension_of_the_space(make_config) -> None:
    plan = axis_plan(make_config, [CPU, OV])
    assert set(plan.flows) == {"static_quant>provider", "dynamic_quant>provider", "provider"}
    assert "provider.provider" in plan.space.params

    def runnable(flow: str, **values: Any) -> bool:
        return plan.is_runnable({"flow": flow, **{k.replace("__", "."): v for k, v in values.items()}})

    assert runnable("static_quant>provider", static_quant__quant_format="QDQ", provider__provider=OV)
    assert runnable("static_quant>provider", static_quant__quant_format="QOperator", provider__provider=CPU)
    # pruned up front: formats the provider cannot load, dynamic quantization outside the CPU provider
    assert not runnable("static_quant>provider", static_quant__quant_format="QOperator", provider__provider=OV)
    assert not runnable("dynamic_quant>provider", provider__provider=OV)
    assert runnable("dynamic_quant>provider", provider__provider=CPU)
    # the original on another provider is a candidate; on the reference provider it is the original
    assert runnable("provider", provider__provider=OV)
    assert not runnable("provider", provider__provider=CPU)


def test_provider_side_rules_say_why() -> None:
    static, dynamic = get_pass("static_quant"), get_pass("dynamic_quant")
    assert refusal(OV, static, {"quant_format": "QOperator"}) is not None
    assert refusal(OV, static, {"quant_format": "QDQ"}) is None
    assert f"runs on {CPU} only" in (refusal(OV, dynamic, {}) or "")  # dynamic_quant.providers
    assert refusal(CPU, dynamic, {}) is None


def test_auto_keeps_what_runs_here_and_says_why_of_the_rest(make_config) -> None:
    loaded = load_config(provider_config(make_config, "auto"))
    providers, skipped = resolve_providers(loaded, LocalBackend())
    assert providers[0] == CPU  # the reference first
    for provider, why in skipped.items():
        assert provider not in providers and why and "\n" not in why
    named = load_config(provider_config(make_config, [CPU, "CUDAExecutionProvider"]))
    with pytest.raises(ConfigError, match=r"target\.providers: .CUDAExecutionProvider. cannot run here"):
        resolve_providers(named, LocalBackend())


def test_a_single_provider_runs_as_before(make_config, tmp_path: Path) -> None:
    """providers: [CPUExecutionProvider] is today's run: no provider settings, no extra trials."""
    config = provider_config(make_config, [CPU])
    result = quantune.tune(config, tmp_path / "run")
    assert all(not (r.session_settings or {}).get("provider") for r in result.trials)
    assert all(r.flow[-1] == "provider" for r in result.trials)
    assert not any(r.flow == ["provider"] for r in result.trials)


def test_a_load_failure_names_its_provider_in_one_line(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"], domain="no.such.domain")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("no.such.domain", 1)]
    )
    path = tmp_path / "bad.onnx"
    onnx.save(model, str(path))
    with pytest.raises(quantune.errors.TrialError) as caught:
        LocalBackend().outputs(path, [{"x": np.zeros((1, 4), np.float32)}], threads=1, runner=None)
    message = str(caught.value)
    assert message.startswith(f"onnxruntime cannot load the model on {CPU}: ") and "\n" not in message


def _best_outputs(folder: Path, python: str, feed: dict[str, np.ndarray], tmp_path: Path) -> list[np.ndarray]:
    """best/run.py run by ``python`` (the target environment's) on ``feed``: its outputs."""
    np.savez(tmp_path / "feed.npz", **feed)
    out = tmp_path / "out.npz"
    subprocess.run([python, str(folder / "run.py"), str(tmp_path / "feed.npz"), str(out)], check=True, timeout=300)
    with np.load(out) as data:
        return [data[name] for name in data.files]


def test_best_runs_as_measured_on_the_cpu_provider(make_config, tmp_path: Path) -> None:
    config = provider_config(make_config, [CPU])
    config["objective"] = "size"  # a quantized model is smaller, exactly: the verdict is improved
    result = quantune.tune(config, tmp_path / "run")
    assert result.verdict == "improved"
    best = tmp_path / "run" / "best"
    session = json.loads((best / "session.json").read_text())
    assert session["provider"] == CPU and session["intra_op_num_threads"] == 1
    feed = {"input": cnn_inputs(16, seed=2)}
    expected = LocalBackend().outputs(Path(result.best.model_path), [feed], threads=1, runner=None)[0]
    produced = _best_outputs(best, sys.executable, feed, tmp_path)
    np.testing.assert_array_equal(produced[0], next(iter(expected.values())))


def test_openvino_originals_and_candidates_measured_on_their_provider(tmp_path: Path, ov_python: Path) -> None:
    """auto in the OpenVINO environment, on the digits CNN: the original on OpenVINO runs first, as
    a candidate with its own accuracy and latency; every candidate's accuracy is that of its own
    provider; nothing OpenVINO cannot load runs there; best/ opens on its provider as measured."""
    config = {
        "model": str(DIGITS / "model.onnx"),
        "data": {"calibration": str(DIGITS / "calib.npz"), "evaluation": str(DIGITS / "eval.npz"), "batch_size": 64},
        # agreement with the original on the CPU provider: a provider's own numbers show in it
        "evaluation": {"metric": "max_abs_diff", "latency": {"warmup": 1, "repeats": 3, "confirm_top": 0}},
        "criterion": {"type": "absolute", "tolerable_loss": 100.0},
        "objective": "size",  # a quantized digits CNN is 3.7x smaller, exactly: the verdict is improved
        "passes": [
            {
                "name": "static_quant",
                "params": {"quant_format": {"search": ["QDQ", "QOperator"]}, "per_channel": False},
            },
        ],
        # best/ on OpenVINO: the static flow runs there only (a user rule over the added step)
        "rules": [{"when": {"flow": "static_quant>provider"}, "forbid": {"provider.provider": [CPU]}}],
        "target": {"python": str(ov_python), "providers": "auto"},
        "search": {"sampler": "exhaustive"},
        "stop": {"max_trials": 6},
        "cache_dir": str(tmp_path / "cache"),
        "executor": {"kind": "inline"},
    }
    result = quantune.tune(config, tmp_path / "run")
    recorded = json.loads((tmp_path / "run" / "results.json").read_text())
    assert recorded["target"]["providers"] == [CPU, OV]

    first = result.trials[0]
    assert first.flow == ["provider"] and first.params["provider.provider"] == OV  # evaluated before the search
    assert first.status == "ok" and first.session_settings and first.session_settings["provider"] == OV
    assert {"max_abs_diff", "latency_ms"} <= set(first.metrics)
    opening = recorded["strategy"]["provider_originals"][OV]  # timed interleaved with the original on the CPU EP
    assert opening["meets"] and opening["paired_ratio"] > 0

    backend = TargetBackend(str(ov_python))
    with np.load(DIGITS / "eval.npz") as data:
        images = data["input"]
    feeds = [{"input": images[i : i + 64]} for i in range(0, len(images), 64)]
    original = [
        next(iter(o.values())) for o in LocalBackend().outputs(DIGITS / "model.onnx", feeds, threads=1, runner=None)
    ]
    checked = 0
    for record in result.trials:
        provider = record.params.get("provider.provider")
        assert (record.session_settings or {}).get("provider", CPU) == provider  # measured where reported
        assert not (provider == OV and record.params.get("static_quant.quant_format") == "QOperator")
        if provider == OV and record.status == "ok":  # its accuracy is OpenVINO's, recomputed here
            mine = backend.outputs(Path(str(record.model_path)), feeds, threads=1, runner=None)
            diff = max(float(np.max(np.abs(next(iter(m.values())) - o))) for m, o in zip(mine, original, strict=True))
            assert record.metrics["max_abs_diff"] == pytest.approx(diff, rel=1e-4, abs=1e-6)
            checked += 1
    assert checked >= 2

    assert result.verdict == "improved" and f"on {OV}" in result.verdict_reason
    best = tmp_path / "run" / "best"
    assert json.loads((best / "session.json").read_text())["provider"] == OV
    written = json.loads((tmp_path / "run" / "results.json").read_text())
    search = written["target"]["session_search"]
    assert written["time_spent_s"]["session settings"] > 0  # said as what it is, not as "writing"
    assert search["cache"]["cache_bytes"] > 0  # OpenVINO's model cache measured at the start it changes
    opens = search["cache"]["opens"]  # session creation alone, fresh caches: first open, then cached
    assert len(opens["first_s"]) == len(opens["cached_s"]) == 2 and min(opens["first_s"] + opens["cached_s"]) > 0
    assert search["cache"]["first_open_s"] == min(opens["first_s"]) and search["cache"]["cached_open_s"] == max(
        opens["cached_s"]
    )
    assert read_session_settings(best / "model.onnx")["provider"] == OV
    expected = backend.outputs(Path(str(result.best.model_path)), feeds[:1], threads=1, runner=None)
    backend.close()
    produced = _best_outputs(best, str(ov_python), feeds[0], tmp_path)
    np.testing.assert_allclose(produced[0], next(iter(expected[0].values())), rtol=1e-5, atol=1e-5)


def test_with_provider_axis_adds_one_step(make_config) -> None:
    loaded = load_config(provider_config(make_config, "auto"))
    expanded, _ = with_provider_axis(loaded, LocalBackend())
    added = [entry for entry in expanded.config.passes if entry.name == "execution_provider"]
    assert len(added) == 1 and expanded.config.target.providers[0] == CPU
    again, _ = with_provider_axis(expanded, LocalBackend())  # idempotent: workers rebuild from it
    assert len(again.config.passes) == len(expanded.config.passes)


def test_the_original_on_another_provider_is_a_candidate_that_can_win() -> None:
    """The decision's side: a model that quantizes nothing is the original in disguise on the
    reference provider, but a candidate of its own on another one (a lossless speed-up)."""
    from quantune.engine.outcome.verdict import decide
    from quantune.engine.trials.selection import is_candidate
    from quantune.engine.trials.trial import TrialRecord

    def record(number: int, latency: float, quantized: int, settings: dict | None) -> TrialRecord:
        metrics = {"latency_ms": latency, "quantized_ops": quantized, "size_bytes": 100.0, "top1": 1.0}
        return TrialRecord(number, ["provider"], {}, "ok", metrics, True, 0.0, latency, session_settings=settings)

    on_ov = record(0, 0.6, 0, {"provider": OV})
    copy = record(1, 0.9, 0, None)
    int8 = record(2, 0.8, 3, None)
    assert is_candidate(on_ov) and not is_candidate(copy) and is_candidate(int8)
    verdict = decide([on_ov, copy, int8], ["latency"], {"latency_ms": 1.0, "size_bytes": 100.0, "top1": 1.0})
    # no side-by-side re-timing here: the search's figures choose it, and the verdict says so
    assert verdict.kind == "unconfirmed" and verdict.best is on_ov


def test_session_search_groups_keep_the_providers_threads() -> None:
    from quantune.engine.measure.session_search import option_groups
    from quantune.passes.onnx.session_tuning import merge_settings as _merged

    groups = option_groups(OV)
    assert [next(iter(group[0])) for group in groups] == [
        "graph_optimization_level",
        "execution_mode",
        "provider_options",  # the precision hint
        "provider_options",  # OpenVINO's own properties (load_config): CPU pinning, bf16 where the CPU has it
    ]
    assert option_groups(CPU)[-1][0] == {"execution_mode": "sequential"}  # no provider options on the CPU provider
    assert all("num_of_threads" not in o["provider_options"] for group in groups[2:] for o in group)  # threads stay
    start = {"provider": OV, "provider_options": {"num_of_threads": "1"}}
    hinted = _merged(start, {"provider_options": {"precision": "ACCURACY"}}, {"precision"})
    assert hinted["provider_options"] == {"num_of_threads": "1", "precision": "ACCURACY"}
    assert _merged(hinted, {"provider_options": {}}, {"precision"})["provider_options"] == {"num_of_threads": "1"}
    # a later group's choice keeps the earlier group's: each replaces only its own keys
    pinned = _merged(hinted, {"provider_options": {"load_config": "{}"}}, {"load_config"})
    assert pinned["provider_options"] == {"num_of_threads": "1", "precision": "ACCURACY", "load_config": "{}"}
    assert _merged(pinned, {"provider_options": {}}, {"load_config"})["provider_options"] == hinted["provider_options"]


def test_best_opens_with_the_searched_openvino_settings_and_its_cache(tmp_path: Path, ov_python: Path) -> None:
    """best/run.py opens the session with the searched OpenVINO options (a load_config property, the
    model cache beside it) and gives the outputs the target gives with the same settings."""
    from quantune.engine.measure.session_search import _ov_config
    from quantune.engine.outcome.deploy import write_deploy
    from quantune.engine.trials.trial import TrialRecord

    best = tmp_path / "best"
    best.mkdir()
    (best / "model.onnx").write_bytes((DIGITS / "model.onnx").read_bytes())
    settings = {
        "provider": OV,
        "provider_options": {"num_of_threads": "1", "load_config": _ov_config(ENABLE_CPU_PINNING="YES")},
    }
    chosen = TrialRecord(3, ["provider"], {}, "ok", {}, True, 0.0, 1.0, session_settings={"provider": OV})
    cache = {"first_open_s": 0.5, "cached_open_s": 0.1, "cache_bytes": 1}  # as cache_effect reports it
    target = {"provider": CPU, "threads": 1, "session_search": {"trial": 3, "settings": settings, "cache": cache}}
    write_deploy(best, chosen, target)
    session = json.loads((best / "session.json").read_text())
    assert session["provider_options"]["cache_dir"] == "ov_cache"
    assert session["provider_options"]["load_config"] == settings["provider_options"]["load_config"]
    assert read_session_settings(best / "model.onnx") == settings  # what evaluations read: no cache path

    with np.load(DIGITS / "eval.npz") as data:
        feed = {"input": data["input"][:8]}
    backend = TargetBackend(str(ov_python))
    expected = backend.outputs(best / "model.onnx", [feed], threads=1, runner=None)
    backend.close()
    produced = _best_outputs(best, str(ov_python), feed, tmp_path)
    np.testing.assert_allclose(produced[0], next(iter(expected[0].values())), rtol=1e-5, atol=1e-5)
    assert any((best / "ov_cache").rglob("*")), "the first session compiled the model into best/ov_cache"


def test_deploy_settings_say_where_and_how(tmp_path: Path) -> None:
    from quantune.engine.outcome.deploy import deploy_sentence, deploy_settings

    target = {"provider": CPU, "provider_options": {}, "threads": 2}
    settings = deploy_settings({"provider": OV, "provider_options": {"num_of_threads": "2"}}, target)
    assert settings["provider"] == OV and settings["provider_options"] == {"num_of_threads": "2"}
    assert settings["intra_op_num_threads"] == 2 and settings["inter_op_num_threads"] == 1
    assert settings["graph_optimization_level"] == "all" and settings["execution_mode"] == "sequential"
    assert deploy_settings(None, target)["provider"] == CPU
    (tmp_path / "best").mkdir()
    (tmp_path / "best" / "session.json").write_text(json.dumps(settings))
    assert deploy_sentence(tmp_path / "best") == (
        f"deploy best/model.onnx on {OV} with 2 threads (num_of_threads=2): python best/run.py"
    )


def test_the_model_cache_is_deployed_only_on_a_measured_open_time_win(tmp_path: Path) -> None:
    """As cache_effect reports it (the fastest first open, the slowest cached one): a cache whose
    cached open was not faster than a first one is not deployed (on onnxruntime-openvino 1.24.1
    a cached session opened no faster on the zoo models measured)."""
    from quantune.engine.outcome.deploy import write_deploy
    from quantune.engine.trials.trial import TrialRecord

    chosen = TrialRecord(3, ["provider"], {}, "ok", {}, True, 0.0, 1.0, session_settings={"provider": OV})
    for cache, deployed in (
        ({"first_open_s": 0.22, "cached_open_s": 0.35, "cache_bytes": 1}, False),
        ({"first_open_s": 0.5, "cached_open_s": 0.1, "cache_bytes": 1}, True),
    ):
        best = tmp_path / str(deployed)
        best.mkdir()
        search = {"trial": 3, "settings": {"provider": OV}, "cache": cache}
        write_deploy(best, chosen, {"provider": CPU, "threads": 1, "session_search": search})
        session = json.loads((best / "session.json").read_text())
        assert ("cache_dir" in session["provider_options"]) is deployed
