"""Random data files through ``quantune run``: wrong names, dtypes, ranks, NaN/Inf, empty arrays,
as .npz files and as feeds from a loader. Every case ends in exit 0 or in one line on stderr and
exit 2 -- never a traceback.

``QUANTUNE_FUZZ_EXAMPLES`` sets the number of examples per test (default 25, so the suite stays
fast); ``make fuzz`` runs many more.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import INLINE_EXECUTOR
from quantune.cli import main

EXAMPLES = int(os.environ.get("QUANTUNE_FUZZ_EXAMPLES", "25"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # nothing written into the working tree
    derandomize=os.environ.get("QUANTUNE_FUZZ_RANDOM") != "1",  # reproducible unless asked otherwise
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)

NAMES = st.sampled_from(["input", "label", "x", "Input", "input ", "", "ü"])
DTYPES = st.sampled_from(
    ["float32", "float64", "float16", "int64", "int32", "uint8", "bool", "complex64", "<U3", "datetime64[s]"]
)
FILLS = st.sampled_from(["normal", "zeros", "nan", "inf", "huge", "ints"])
# Near the model's [N, 1, 8, 8] most of the time, anything small otherwise.
SHAPES = st.one_of(
    st.tuples(st.integers(0, 6), st.just(1), st.just(8), st.just(8)),
    st.tuples(st.integers(0, 6), st.integers(0, 3), st.integers(0, 9), st.integers(0, 9)),
    st.lists(st.integers(0, 5), min_size=0, max_size=5).map(tuple),
)

LOADER = """
import numpy as np

def feeds():
    data = np.load({path!r})
    arrays = {{key: data[key] for key in data.files}}
    rows = min((len(a) for a in arrays.values()), default=0)
    return [{{key: a[i:i + 1] for key, a in arrays.items()}} for i in range(rows)]
"""


@st.composite
def arrays(draw) -> np.ndarray:
    shape, dtype, fill = draw(SHAPES), draw(DTYPES), draw(FILLS)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    if dtype == "<U3":
        return np.full(shape, "ab", dtype=dtype)
    if dtype.startswith("datetime"):
        return np.zeros(shape, dtype=dtype)
    values = {
        "normal": lambda: rng.normal(0, 1, shape),
        "zeros": lambda: np.zeros(shape),
        "nan": lambda: np.where(rng.random(shape) < 0.3, np.nan, rng.normal(0, 1, shape)),
        "inf": lambda: np.where(rng.random(shape) < 0.3, np.inf, rng.normal(0, 1, shape)),
        "huge": lambda: rng.normal(0, 1e30, shape),
        "ints": lambda: rng.integers(-3, 5, shape),
    }[fill]()
    with np.errstate(all="ignore"):
        return values.astype(dtype) if dtype != "bool" else values > 0


@st.composite
def data_files(draw) -> dict[str, np.ndarray]:
    """A dict of arrays for one .npz: usually a (maybe broken) 'input' and 'label', sometimes anything."""
    if draw(st.booleans()):
        rows = draw(st.integers(0, 6))
        out = {"input": draw(arrays())}
        if draw(st.booleans()):
            out["input"] = np.random.default_rng(rows).normal(0, 1, (rows, 1, 8, 8)).astype("float32")
        if draw(st.booleans()):
            out["label"] = np.zeros(draw(st.sampled_from([rows, rows + 1, 0])), dtype=draw(DTYPES))
        return out
    return draw(st.dictionaries(NAMES, arrays(), max_size=3))


def run_cli(tmp_path: Path, config: dict[str, Any], capsys) -> None:
    folder = tmp_path / uuid.uuid4().hex
    folder.mkdir()
    config_path = folder / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    code = main(["run", str(config_path), "--output", str(folder / "out"), "--quiet"])  # a traceback fails the test
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    assert code in (0, 2), (code, captured.err)
    if code == 2:
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("quantune: error: "), captured.err


@pytest.fixture
def base(tmp_path: Path, cnn_model: Path, cnn_data: dict[str, Path]) -> dict[str, Any]:
    return {
        "model": str(cnn_model),
        "data": {
            "calibration": str(cnn_data["calibration"]),
            "evaluation": str(cnn_data["evaluation"]),
            "batch_size": 4,
        },
        "evaluation": {"metric": "top1", "latency": {"warmup": 0, "repeats": 1, "confirm_top": 0}},
        "criterion": {"type": "absolute", "tolerable_loss": 1.0},
        "passes": [{"name": "static_quant"}],
        "stop": {"max_trials": 1},
        "cache_dir": str(tmp_path / "cache"),
        **INLINE_EXECUTOR,
    }


def _save(tmp_path: Path, arrays: dict[str, np.ndarray], as_feeds: bool) -> str:
    path = tmp_path / f"{uuid.uuid4().hex}.npz"
    try:
        np.savez(path, **arrays)
    except Exception:  # a name numpy cannot store: an empty file is bad data too
        path.write_bytes(b"")
    if not as_feeds:
        return str(path)
    script = tmp_path / f"{uuid.uuid4().hex}.py"
    script.write_text(LOADER.format(path=str(path)))
    return f"{script}:feeds"


@FUZZ
@given(files=data_files(), as_feeds=st.booleans(), metric=st.sampled_from(["top1", "cosine"]))
def test_random_evaluation_data_ends_in_a_run_or_one_line(base, tmp_path, capsys, files, as_feeds, metric):
    base["data"]["evaluation"] = _save(tmp_path, files, as_feeds)
    base["evaluation"]["metric"] = metric
    run_cli(tmp_path, base, capsys)


@FUZZ
@given(files=data_files(), as_feeds=st.booleans(), method=st.sampled_from(["MinMax", "Entropy", "Percentile"]))
def test_random_calibration_data_ends_in_a_run_or_one_line(base, tmp_path, capsys, files, as_feeds, method):
    base["data"]["calibration"] = _save(tmp_path, files, as_feeds)
    base["passes"] = [{"name": "static_quant", "params": {"calibrate_method": method}}]
    run_cli(tmp_path, base, capsys)
