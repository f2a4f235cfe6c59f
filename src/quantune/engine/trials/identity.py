"""A run's identity: the config plus the content of everything it names that changes a score.

The same config text can mean another run (data edited in place, a script changed), so each
source gets a content fingerprint. Resume refuses a changed source instead of mixing scores,
workers check again after loading, and the evaluation cache key holds what changes an evaluation.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantune.errors import QuantuneError
from quantune.model import file_sha256
from quantune.store import cache_key
from quantune.userlocal import script_fingerprint

if TYPE_CHECKING:
    from quantune.config import LoadedConfig

Sources = dict[str, dict[str, str]]  # config field -> {"label": what the config names, "fingerprint": ...}
NOT_EVALUATED = ("model", "data.calibration")  # the evaluation key has the model's hash; calibration never scores


def _script_sha(spec: str, loaded: LoadedConfig) -> str | None:
    """The fingerprint of the script in ``path/to/script.py:function`` and of the modules it imports
    from its folder (None for other specs)."""
    if ".py:" not in spec:
        return None
    path = loaded.resolve(spec.rpartition(":")[0])
    return script_fingerprint(path) if path.is_file() else None


def _plugin_sha(plugin: str, loaded: LoadedConfig) -> str:
    if plugin.endswith(".py"):
        path = loaded.resolve(plugin)
        return script_fingerprint(path) if path.is_file() else "missing"
    try:
        spec = importlib.util.find_spec(plugin)
    except (ImportError, ValueError):
        spec = None
    origin = getattr(spec, "origin", None)
    if origin and Path(origin).is_file():
        return file_sha256(origin)
    return f"module {plugin}"


def run_sources(loaded: LoadedConfig, context: Any) -> Sources:
    """The fingerprint of every source of ``loaded``'s run, by the config field naming it."""
    config = loaded.config
    label = config.model if isinstance(config.model, str) else config.model.label
    sources: Sources = {"model": {"label": label, "fingerprint": context.model.sha256}}
    datasets: dict[str, tuple[str | None, Any]] = {
        "data.calibration": (config.data.calibration, context.calibration),
        "data.evaluation": (config.data.evaluation, context.evaluator.dataset),
    }
    for name, (spec, dataset) in datasets.items():
        if spec and dataset is not None:
            script = _script_sha(spec, loaded)
            sources[name] = {"label": spec, "fingerprint": cache_key(dataset.fingerprint, script)}
            if script is not None:  # a loader: other data from the same script is the loader's doing
                sources[name]["script"] = script
    scripts = {
        "evaluation.metric": config.evaluation.metric,
        "evaluation.runner": getattr(config.evaluation, "runner", None),
    }
    for name, spec in scripts.items():
        sha = _script_sha(spec, loaded) if isinstance(spec, str) else None
        if sha is not None:
            sources[name] = {"label": spec.rpartition(":")[0], "fingerprint": sha}
    for index, plugin in enumerate(config.plugins):
        sources[f"plugins[{index}]"] = {"label": plugin, "fingerprint": _plugin_sha(plugin, loaded)}
    return sources


def fingerprints(sources: Mapping[str, Mapping[str, str]], *, evaluation_only: bool = False) -> dict[str, str]:
    """``field -> fingerprint``; with ``evaluation_only``, only the sources that change an evaluation."""
    return {
        name: source["fingerprint"]
        for name, source in sorted(sources.items())
        if not (evaluation_only and name in NOT_EVALUATED)
    }


def changed_sources(stored: Mapping[str, Mapping[str, str]], current: Mapping[str, Mapping[str, str]]) -> list[str]:
    """What differs between two runs' sources, as ``field (label)``; added or removed ones too."""
    changed = []
    for name in sorted(set(stored) | set(current)):
        before, now = stored.get(name), current.get(name)
        if before is None or now is None or before.get("fingerprint") != now.get("fingerprint"):
            label = (now or before or {}).get("label", "")
            changed.append(f"{name} ({label})" if label else name)
    return changed


def check_model_unchanged(context: Any) -> None:
    """Refuses to go on once the user's model file no longer holds what the run hashed at its start:
    trials and timings read it all through the run."""
    expected = context.sources.get("model")
    if expected is not None:
        now = context.model.current_sha256() or "missing"
        check_unchanged({"model": expected}, {"model": {**expected, "fingerprint": now}})


def check_unchanged(expected: Mapping[str, Mapping[str, str]], current: Mapping[str, Mapping[str, str]]) -> None:
    """Refuses to go on with sources that changed since the run started (a worker's check)."""
    changed = changed_sources(expected, current)
    for name, now in current.items():
        before = expected.get(name) or {}
        if (
            now.get("script")
            and before.get("script") == now["script"]
            and before.get("fingerprint") != now["fingerprint"]
        ):
            raise QuantuneError(
                f"{name} ({now.get('label')}) returned other data in a worker than it did at the start, though the "
                "script is the same: a loader must return the same data on every call; make it deterministic "
                "(e.g. seed its random numbers: np.random.default_rng(0)) and leave the files it reads as they are"
            )
    if changed:
        raise QuantuneError(
            f"{', '.join(changed)} changed while this run was going on; its trials would mix the old and "
            "the new content. Run again once the files are final (the run resumes only with --restart)"
        )
