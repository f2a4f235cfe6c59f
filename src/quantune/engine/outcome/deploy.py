"""What to deploy: ``best/session.json`` (where and how the model was measured) and ``best/run.py``.

A model opened with other session settings runs at another speed, and on another provider may
score otherwise, so ``best/`` records them all and ``run.py`` (numpy and onnxruntime only)
opens the session exactly as the evaluation did.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quantune.evaluate.session_file import write_session_settings
from quantune.space.providers import CPU

RUN_PY = '''"""Opens best/model.onnx exactly as quantune measured it (best/session.json): python run.py [inputs.npz]"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

HERE = Path(__file__).resolve().parent
LEVELS = {"disable_all": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
          "all": "ORT_ENABLE_ALL"}


def open_session(folder=HERE):
    s = json.loads((Path(folder) / "session.json").read_text())
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(s["intra_op_num_threads"])
    options.inter_op_num_threads = int(s["inter_op_num_threads"])
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[s["graph_optimization_level"]])
    options.execution_mode = getattr(ort.ExecutionMode, "ORT_" + s["execution_mode"].upper())
    for key, value in s.get("config", {}).items():
        options.add_session_config_entry(key, str(value))
    for key in ("enable_mem_pattern", "enable_cpu_mem_arena"):
        if key in s:
            setattr(options, key, bool(s[key]))
    provider_options = dict(s["provider_options"])
    if "cache_dir" in provider_options:  # OpenVINO's model cache, beside this file unless absolute
        provider_options["cache_dir"] = str(Path(folder) / provider_options["cache_dir"])
    provider = (s["provider"], provider_options) if provider_options else s["provider"]
    providers = [provider] + (["CPUExecutionProvider"] if s["provider"] != "CPUExecutionProvider" else [])
    return ort.InferenceSession(str(Path(folder) / "model.onnx"), options, providers=providers)


def zeros(session):
    types = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32,
             "tensor(float16)": np.float16, "tensor(uint8)": np.uint8, "tensor(int8)": np.int8,
             "tensor(bool)": np.bool_, "tensor(double)": np.float64}
    return {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], types.get(i.type, np.float32))
            for i in session.get_inputs()}


if __name__ == "__main__":
    session = open_session()
    feed = dict(np.load(sys.argv[1])) if len(sys.argv) > 1 else zeros(session)
    feed = {i.name: feed[i.name] for i in session.get_inputs()}
    outputs = session.run(None, feed)
    start = time.perf_counter()
    session.run(None, feed)
    took = (time.perf_counter() - start) * 1000
    print(f"{session.get_providers()[0]}: outputs {[o.shape for o in outputs]}, one run {took:.2f} ms")
    if len(sys.argv) > 2:
        np.savez(sys.argv[2], **{o.name: v for o, v in zip(session.get_outputs(), outputs)})
'''


CACHE_DIR = "ov_cache"  # OpenVINO's compiled-model cache, relative to best/ (run.py resolves it there)


def deploy_settings(settings: Mapping[str, Any] | None, target: Mapping[str, Any]) -> dict[str, Any]:
    """The full session of a measured candidate: its own settings over every evaluation session's."""
    own = dict(settings or {})
    provider = own.pop("provider", None) or target.get("provider") or CPU
    options = own.pop("provider_options", None)
    if options is None:
        options = target.get("provider_options", {}) if provider == target.get("provider") else {}
    config = {"session.intra_op.allow_spinning": "0", **dict(own.pop("config", {}) or {})}
    threads = int(target.get("threads") or 1)
    return {
        "provider": provider,
        "provider_options": {str(k): str(v) for k, v in dict(options).items()},
        "graph_optimization_level": own.pop("graph_optimization_level", "all"),
        "execution_mode": own.pop("execution_mode", "sequential"),
        "intra_op_num_threads": int(own.pop("intra_op_num_threads", threads)),
        "inter_op_num_threads": int(own.pop("inter_op_num_threads", 1)),
        "config": config,
        **own,
    }


def write_deploy(folder: Path, chosen: Any, target: Mapping[str, Any] | None) -> None:
    """``folder``/session.json and ``folder``/run.py for ``chosen``'s model saved there: its
    settings, or those the session search chose for it (then also beside the model)."""
    if target is None:
        return
    settings = chosen.session_settings
    search = target.get("session_search") or {}
    if search.get("trial") == chosen.number and search.get("settings") is not None:
        settings = search["settings"]
        if settings:
            write_session_settings(folder / "model.onnx", dict(settings))
    deployed = deploy_settings(settings, target)
    cache = search.get("cache") if search.get("trial") == chosen.number else None
    if cache and cache.get("cached_open_s", 1e9) < cache.get("first_open_s", 0.0):  # it cut the start
        deployed["provider_options"]["cache_dir"] = CACHE_DIR
    (folder / "session.json").write_text(json.dumps(deployed, indent=1, sort_keys=True) + "\n")
    (folder / "run.py").write_text(RUN_PY)


def deploy_sentence(folder: Path) -> str | None:
    """One sentence: where and how to deploy what ``folder`` holds (None without session.json)."""
    try:
        s = json.loads((folder / "session.json").read_text())
    except (OSError, ValueError):
        return None
    threads = s.get("intra_op_num_threads", 1)
    extra = [f"{k}={v}" for k, v in sorted(s.get("provider_options", {}).items())]
    if s.get("graph_optimization_level", "all") != "all":
        extra.append(f"graph optimization {s['graph_optimization_level']}")
    if s.get("execution_mode", "sequential") != "sequential":
        extra.append(f"{s['execution_mode']} execution")
    how = f" ({', '.join(extra)})" if extra else ""
    return (
        f"deploy {folder.name}/model.onnx on {s.get('provider')} with {threads} thread{'s' if threads != 1 else ''}"
        f"{how}: python {folder.name}/run.py"
    )
