"""Random user code and a hostile environment through ``quantune run`` (issue 26).

The config and data fuzzers (test_config_fuzz.py, test_data_fuzz.py) cover what a user writes
down; this one covers what the user's code *does* and what the machine does to the run:

- a **loader**, **metric** or **runner** script that raises, returns the wrong type (None, a
  string, NaN, an array, a dict for a list, a list of the wrong length), returns something
  else on every call, or is sometimes fine -- drawn per call site, combined at random;
- the **environment**: a file where the output or cache folder should be, outputs of the
  previous run deleted (``results.json``, ``best/``, ``run.db``) before a resume, a read-only
  output folder (a read-only tmpfs where mounting is allowed).

Every case ends in exit 0, or in exactly one ``quantune: error:`` line on stderr naming the
field, script or folder at fault with exit 2 (1 for the machine) -- never a traceback. Hangs
are left out of the random draws (each needs worker processes and real seconds): one metric
that never returns is run under the existing limit (``executor.trial_timeout_s``) below; a
loader that never returns has no limit yet (issue 26 item 6). Exiting (``os._exit``) is covered
in test_firsthour_faults.py with real workers for the same reason.

``QUANTUNE_FUZZ_EXAMPLES`` sets the examples per test (default 6, so the suite stays within
seconds); ``make fuzz`` runs many more, new ones each time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import INLINE_EXECUTOR
from quantune.cli import main

EXAMPLES = int(os.environ.get("QUANTUNE_FUZZ_EXAMPLES", "6"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=os.environ.get("QUANTUNE_FUZZ_RANDOM") != "1",
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# What one call of the user's function does; `good` is what the function would return when right.
BEHAVIOURS = {
    "good": "return good",
    "raise": "raise ValueError('broken on purpose')",
    "keyerror": "raise KeyError('input')",
    "none": "return None",
    "string": "return 'not data'",
    "int": "return 7",
    "nan": "return float('nan')",
    "inf": "return float('inf')",
    "array": "return np.zeros(3)",
    "empty_list": "return []",
    "empty_dict": "return {}",
    "list_of_ints": "return [1, 2, 3]",
    "dict_of_strings": "return {'input': 'abc'}",
    "object_array": "return {'input': np.array([object(), object()], dtype=object)}",
    "changing": "return perturb(good)",  # something else on every call
    "sometimes": "return good if CALLS[0] % 2 else None",  # right on every other call
}

PRELUDE = """
import numpy as np

CALLS = [0]
DATA = {data!r}


def perturb(value):
    rng = np.random.default_rng(CALLS[0])
    if isinstance(value, dict):
        return {{k: (v + rng.normal(0, 1, v.shape).astype(v.dtype) if v.dtype.kind == 'f' else v) for k, v in value.items()}}
    if isinstance(value, list):
        return [perturb(v) for v in value]
    return float(value) + rng.random()
"""

LOADER = """
def load():
    CALLS[0] += 1
    good = dict(np.load(DATA))
    {body}
"""

METRIC = """
def score(outputs, data):
    CALLS[0] += 1
    logits = outputs[next(iter(outputs))] if isinstance(outputs, dict) else outputs
    good = float(np.mean(np.argmax(logits, axis=1) == data['label']))
    {body}
"""

RUNNER = """
def run(session, feeds):
    CALLS[0] += 1
    good = [dict(zip([o.name for o in session.get_outputs()], session.run(None, dict(feed)))) for feed in feeds]
    {body}
"""

SITES = {
    "data.evaluation": (LOADER, "load"),
    "evaluation.metric": (METRIC, "score"),
    "evaluation.runner": (RUNNER, "run"),
}


@pytest.fixture
def base(tmp_path: Path, cnn_model: Path, cnn_data: dict[str, Path]) -> dict[str, Any]:
    return {
        "model": str(cnn_model),
        "data": {
            "calibration": str(cnn_data["calibration"]),
            "evaluation": str(cnn_data["evaluation"]),
            "batch_size": 16,
        },
        "evaluation": {"metric": "top1", "latency": {"warmup": 0, "repeats": 1, "confirm_top": 0}},
        "criterion": {"type": "absolute", "tolerable_loss": 0.5},
        "passes": [{"name": "static_quant", "params": {"quant_format": {"search": ["QDQ", "QOperator"]}}}],
        "search": {"sampler": "exhaustive"},
        "stop": {"max_trials": 2},
        "cache_dir": str(tmp_path / "cache"),
        **INLINE_EXECUTOR,
    }


def check_outcome(code: int, out: str, err: str, names: list[str]) -> None:
    """Exit 0, or one error line naming one of ``names`` (exit 2; 1 for the machine); no traceback."""
    assert "Traceback" not in out + err, err
    assert code in (0, 1, 2), (code, err)
    if code == 0:
        return
    lines = [line for line in err.strip().splitlines() if not line.startswith("quantune: warning:")]
    assert len(lines) == 1 and lines[0].startswith("quantune: error: "), err
    assert any(name in lines[0] for name in names), (names, lines[0])


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@FUZZ
@given(
    chosen=st.dictionaries(st.sampled_from(sorted(SITES)), st.sampled_from(sorted(BEHAVIOURS)), min_size=1, max_size=3)
)
def test_user_code_that_misbehaves_ends_in_a_run_or_one_line(base, tmp_path, capsys, chosen):
    folder = tmp_path / uuid.uuid4().hex
    folder.mkdir()
    config = yaml.safe_load(yaml.safe_dump(base))
    named = ["evaluation.metric", "data.evaluation", "evaluation.runner", "metric", "runner", "evaluation"]
    for site, behaviour in chosen.items():
        template, function = SITES[site]
        script = folder / f"{site.split('.')[-1]}.py"
        body = BEHAVIOURS[behaviour]
        script.write_text(PRELUDE.format(data=base["data"]["evaluation"]) + template.format(body=body))
        section, key = site.split(".")
        config[section][key] = f"{script}:{function}"
        named.append(script.name)
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    code, out, err = run_cli(["run", str(folder / "config.yaml"), "-o", str(folder / "out"), "-q"], capsys)
    check_outcome(code, out, err, named)


def _in_the_way(folder: Path, what: str) -> tuple[list[str], list[str]]:
    """Extra CLI arguments and config changes that put something in the run's way."""
    blocker = folder / "afile"
    blocker.write_text("mine")
    if what == "output_is_a_file":
        return ["-o", str(blocker)], []
    if what == "output_under_a_file":
        return ["-o", str(blocker / "out")], []
    if what == "cache_is_a_file":
        return ["-o", str(folder / "out")], ["cache_dir"]
    if what == "output_holds_foreign_files":
        (folder / "theirs").mkdir()
        (folder / "theirs" / "notes.txt").write_text("{}")  # (a results.json of theirs: issue 26 item 4)
        return ["-o", str(folder / "theirs")], []
    raise AssertionError(what)


@FUZZ
@given(
    what=st.sampled_from(["output_is_a_file", "output_under_a_file", "cache_is_a_file", "output_holds_foreign_files"])
)
def test_files_in_the_way_end_in_one_line_and_are_left_alone(base, tmp_path, capsys, what):
    folder = tmp_path / uuid.uuid4().hex
    folder.mkdir()
    args, fields = _in_the_way(folder, what)
    config = dict(base)
    if "cache_dir" in fields:
        config["cache_dir"] = str(folder / "afile")
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    code, out, err = run_cli(["run", str(folder / "config.yaml"), *args, "-q"], capsys)
    check_outcome(code, out, err, ["--output", "cache_dir", "afile", "theirs"])
    assert code == 2
    assert (folder / "afile").read_text() == "mine"
    if what == "output_holds_foreign_files":
        assert (folder / "theirs" / "notes.txt").read_text() == "{}"


@FUZZ
@given(
    deleted=st.lists(st.sampled_from(["results.json", "best", "config.json", "quantune.log", "workers"]), unique=True)
)
def test_outputs_deleted_between_runs_are_written_again(base, tmp_path, capsys, deleted):
    folder = tmp_path / uuid.uuid4().hex
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(base))
    args = ["run", str(folder / "config.yaml"), "-o", str(folder / "out"), "-q"]
    assert run_cli(args, capsys)[0] == 0
    before = yaml.safe_load((folder / "out" / "results.json").read_text())
    had_best = (folder / "out" / "best" / "model.onnx").is_file()
    for name in deleted:
        path = folder / "out" / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    code, out, err = run_cli(args, capsys)
    check_outcome(code, out, err, ["--output", "out"])
    assert code == 0
    after = yaml.safe_load((folder / "out" / "results.json").read_text())
    assert [t["params"] for t in after["trials"]] == [t["params"] for t in before["trials"]]
    assert (after.get("best") or {}).get("number") == (before.get("best") or {}).get("number")
    assert (folder / "out" / "best" / "model.onnx").is_file() == had_best


def test_a_read_only_output_folder_is_one_line(base, tmp_path, capsys):
    point = tmp_path / "ro"
    point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(point)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here ({done.stderr.decode().strip() or 'not permitted'})")
    try:
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(base))
        code, out, err = run_cli(["run", str(tmp_path / "config.yaml"), "-o", str(point / "out"), "-q"], capsys)
        check_outcome(code, out, err, ["--output"])
        assert code == 2
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def test_a_metric_that_never_returns_ends_within_the_trial_limit(base, tmp_path):
    """Under ``executor.trial_timeout_s`` the original's evaluation is killed at the limit: one line."""
    import sys

    (tmp_path / "hangs.py").write_text("import time\n\ndef score(outputs, data):\n    time.sleep(3600)\n")
    config = {**base, "executor": {"kind": "process", "trial_timeout_s": 2}}
    config["evaluation"] = {**base["evaluation"], "metric": "hangs.py:score"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "src"), "QUANTUNE_REPORT": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "quantune", "run", "config.yaml", "-q", "-o", "out"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    check_outcome(done.returncode, done.stdout, done.stderr, ["2 s"])
    assert done.returncode == 2 and "timeout" in done.stderr
