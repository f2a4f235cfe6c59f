"""Fuzzed configs through ``quantune space`` and ``quantune run``: exit 0, or one line and exit 2.

Hypothesis mutates a valid config (wrong types, unknown keys, out-of-range numbers, missing
files, deleted keys) or breaks its YAML; every case must end in exit 0 or in exactly one
``quantune: error:`` line with exit 2 -- a traceback (any other exception out of the CLI)
fails the test with the config that caused it. The CLI runs in this process (``main(argv)``)
so each example costs a config check or a two-trial inline run, not an interpreter start.

``QUANTUNE_FUZZ_EXAMPLES`` sets the number of examples per test (default 30; ``make
fuzz-config`` runs many more).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from quantune.cli import main  # noqa: E402

EXAMPLES = int(os.environ.get("QUANTUNE_FUZZ_EXAMPLES", "30"))
EXAMPLE_LIMIT_S = 60.0
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("QUANTUNE_FUZZ_RANDOM") is None,  # CI: the same cases every time
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
ANY_VALUE = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=3),
    st.dictionaries(st.text(min_size=1, max_size=6), SCALARS, max_size=3),
)
OUT_OF_RANGE = st.sampled_from([-1, 0, -(10**9), 10**18, 2**63, -0.5, 1e-300, math.nan, math.inf, -math.inf, 1e308])
MISSING = st.sampled_from(
    ["missing.onnx", "missing/eval.npz", "missing.py:score", "/nonexistent/folder/file", "", ".", "cnn.onnx:main"]
)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    from robust_helpers import PRIVATE_LATENCY_LOCK, make_project

    folder = tmp_path_factory.mktemp("fuzz-project")
    make_project(folder, max_trials=2)
    previous = os.environ.get("QUANTUNE_LATENCY_LOCK")
    os.environ["QUANTUNE_LATENCY_LOCK"] = PRIVATE_LATENCY_LOCK  # (see robust_helpers)
    yield folder
    if previous is None:
        os.environ.pop("QUANTUNE_LATENCY_LOCK", None)
    else:
        os.environ["QUANTUNE_LATENCY_LOCK"] = previous


def base_config() -> dict[str, Any]:
    """A small valid config (relative paths: the fuzzed file sits beside the model and data)."""
    return {
        "model": "cnn.onnx",
        "data": {"calibration": "calib.npz", "evaluation": "eval.npz", "batch_size": 16, "label_key": "label"},
        "evaluation": {"metric": "top1", "latency": {"warmup": 1, "repeats": 2, "threads": 1, "confirm_top": 0}},
        "criterion": {"type": "relative", "tolerable_loss": 0.05},
        "objective": "latency",
        "passes": [{"name": "dynamic_quant", "params": {"weight_type": {"search": ["int8", "uint8"]}}}],
        "search": {"sampler": "exhaustive", "seed": 0},
        "stop": {"max_trials": 2},
        "cache_dir": "cache",
        "executor": {"kind": "inline"},
    }


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in ``node`` a mutation can hit (dict keys and list indexes)."""
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*prefix, index))
    return found


def _parent(config: Any, path: tuple) -> Any:
    for part in path[:-1]:
        config = config[part]
    return config


@st.composite
def mutated(draw) -> dict[str, Any]:
    config = base_config()
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(config)
        kind = draw(st.sampled_from(["wrong_type", "unknown_key", "out_of_range", "missing_file", "delete"]))
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = _parent(config, path)
        with contextlib.suppress(KeyError, IndexError, TypeError):
            if kind == "wrong_type":
                parent[path[-1]] = draw(ANY_VALUE)
            elif kind == "out_of_range":
                parent[path[-1]] = draw(OUT_OF_RANGE)
            elif kind == "missing_file":
                parent[path[-1]] = draw(MISSING)
            elif kind == "delete":
                del parent[path[-1]]
            else:
                target = parent[path[-1]] if isinstance(parent[path[-1]], dict) else parent
                if isinstance(target, dict):
                    target[draw(st.text(min_size=1, max_size=10))] = draw(ANY_VALUE)
    return config


class _TooSlow(Exception):
    """A valid config whose run takes longer than an example may (e.g. 100000 latency repeats)."""


def _too_slow(signum, frame) -> None:
    raise _TooSlow


def _cli(argv: list[str]) -> tuple[int, str]:
    """``quantune ARGV`` in this process: exit code and stderr (a traceback propagates). A call
    still running after ``EXAMPLE_LIMIT_S`` counts as a valid, slow config (exit 0)."""
    err, out = io.StringIO(), io.StringIO()
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
    signal.signal(signal.SIGALRM, _too_slow)
    signal.setitimer(signal.ITIMER_REAL, EXAMPLE_LIMIT_S)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse
                code = exc.code if isinstance(exc.code, int) else 2
            except _TooSlow:
                code = 0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return code, err.getvalue()


def _assert_clean(code: int, err: str, config_text: str) -> None:
    where = f"\n--- config ---\n{config_text[:2000]}\n--- stderr ---\n{err[-2000:]}"
    assert code in (0, 2), f"exit {code}{where}"
    assert "Traceback" not in err, where
    errors = [line for line in err.splitlines() if line.startswith("quantune: error:")]
    if code == 2:
        assert len(errors) == 1, f"not one error line{where}"
        other = [line for line in err.strip().splitlines() if not line.startswith("quantune: ")]
        assert not other, f"more than one line{where}"
    else:
        assert not errors, where


def _write(project: Path, text: str, suffix: str = ".yaml") -> Path:
    handle, name = tempfile.mkstemp(suffix=suffix, dir=project)
    with os.fdopen(handle, "w") as file:
        file.write(text)
    return Path(name)


def _check_both(project: Path, path: Path, text: str) -> None:
    code, err = _cli(["space", str(path), "--samples", "2"])
    _assert_clean(code, err, text)
    hypothesis.event(f"space: exit {code}")
    output = tempfile.mkdtemp(prefix="out-", dir=project)
    code, err = _cli(["run", str(path), "--output", output, "--quiet", "--executor", "inline"])
    _assert_clean(code, err, text)
    hypothesis.event(f"run: exit {code}")  # pytest --hypothesis-show-statistics shows the mix


@FUZZ
@given(config=mutated(), as_json=st.booleans())
def test_mutated_configs_end_in_exit_0_or_one_line_with_exit_2(project: Path, config: dict[str, Any], as_json: bool):
    text = json.dumps(config) if as_json else yaml.safe_dump(config, sort_keys=False)
    path = _write(project, text, ".json" if as_json else ".yaml")
    _check_both(project, path, text)


@st.composite
def broken_yaml(draw) -> str:
    text = yaml.safe_dump(base_config(), sort_keys=False)
    how = draw(st.sampled_from(["truncate", "insert", "replace", "random", "tabs"]))
    at = draw(st.integers(min_value=0, max_value=len(text)))
    if how == "truncate":
        return text[:at]
    if how == "insert":
        return (
            text[:at]
            + draw(st.sampled_from([":", "- ", "{", "[", "'", '"', "&a", "*b", "!!python/object", "\t", "%"]))
            + text[at:]
        )
    if how == "replace":
        return text[:at] + draw(st.text(max_size=8)) + text[at + 4 :]
    if how == "tabs":
        return text.replace("  ", "\t")
    return draw(st.text(max_size=60))


@FUZZ
@given(text=broken_yaml())
def test_broken_yaml_ends_in_exit_0_or_one_line_with_exit_2(project: Path, text: str):
    path = _write(project, text)
    _check_both(project, path, text)


@pytest.mark.parametrize(
    "change",
    [
        {"model": "missing.onnx"},
        {"data": {"evaluation": "missing.npz"}},
        {"evaluation": {"metric": "missing.py:score"}},
        {"plugins": ["missing_plugin.py"]},
        {"passes": [{"name": "no_such_pass"}]},
        {"stop": {"max_trials": -1}},
        {"criterion": {"type": "relative", "tolerable_loss": math.nan}},
        {"search": {"sampler": "no_such_sampler"}},
        {"executor": {"kind": "inline", "workers": 0}},
        {"unknown_top_level_key": 1},
        {"evaluation": {"metric": "top1", "latency": {"warmup": 2**63}}},
        {"evaluation": {"metric": "top1", "latency": {"repeats": 10**18}}},
        {"search": {"sampler": "random", "seed": -1}},
        {"executor": {"kind": "inline", "workers": 10**9}},
    ],
    ids=lambda change: json.dumps(change)[:40],
)
def test_named_mistakes_each_end_in_one_line_with_exit_2(project: Path, change: dict[str, Any]):
    config = copy.deepcopy(base_config())
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    text = yaml.safe_dump(config, sort_keys=False)
    path = _write(project, text)
    output = tempfile.mkdtemp(prefix="out-", dir=project)
    code, err = _cli(["run", str(path), "--output", output, "--quiet", "--executor", "inline"])
    _assert_clean(code, err, text)
    assert code == 2
