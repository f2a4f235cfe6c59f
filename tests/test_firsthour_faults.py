"""Issue 26 (items 8, 9): faults whose message named the wrong thing -- a memory limit too small to
start Python, a metric that ends its process, a model with no inputs, full output and cache
disks, a loader that is not deterministic. Each is now one line naming the right field, file or
disk (exit 2; exit 1 for a full disk), never a traceback."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from quantune.cli import main
from quantune.store.faults import written_path

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "examples" / "digits"


def quantune(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "QUANTUNE_REPORT": "0"}
    return subprocess.run(
        [sys.executable, "-m", "quantune", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def one_line(done: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quantune: error: "), done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def digits(tmp_path: Path) -> Callable[..., Path]:
    """The bundled example in tmp_path, with a fast evaluation; returns a writer of its config."""
    project = tmp_path / "digits"
    project.mkdir()
    for name in ("model.onnx", "calib.npz", "eval.npz"):
        shutil.copy(DIGITS / name, project / name)
    config: dict[str, Any] = yaml.safe_load((DIGITS / "config.yaml").read_text())
    config["evaluation"]["latency"] = {"warmup": 0, "repeats": 2, "confirm_top": 0}
    config["stop"] = {"max_trials": 3}
    config["cache_dir"] = str(tmp_path / "cache")

    def write(**changes: Any) -> Path:
        for dotted, value in changes.items():
            node = config
            *parents, last = dotted.split("__")
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
        path = project / "config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    return write


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str, str], Path]]:
    mounted: list[Path] = []

    def mount(name: str, size: str) -> Path:
        point = tmp_path / name
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip() or 'not permitted'})")
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


@pytest.mark.parametrize("limit", [1, 100])
def test_a_memory_limit_too_small_to_start_python(digits, capsys, limit):
    code = main(["check", str(digits(executor__memory_limit_mb=limit))])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "executor.memory_limit_mb" in err and "too small" in err and "512" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_metric_that_ends_its_process(digits):
    config = digits(evaluation__metric="exits.py:score")
    (config.parent / "exits.py").write_text("import os\n\ndef score(outputs, data):\n    os._exit(3)\n")
    line = one_line(quantune("run", str(config), "-q", "-o", "out", cwd=config.parent), 2, "os._exit(3)")
    assert "__main__" not in line and "metric" in line


def test_a_loader_that_is_not_deterministic(digits):
    config = digits(data__evaluation="noisy.py:load")
    (config.parent / "noisy.py").write_text(
        "import numpy as np\n\ndef load():\n    data = dict(np.load('eval.npz'))\n"
        "    data['input'] = data['input'] + np.random.default_rng().normal(0, 0.01, data['input'].shape)"
        ".astype('float32')\n    return data\n"
    )
    line = one_line(quantune("run", str(config), "-q", "-o", "out", cwd=config.parent), 2, "data.evaluation")
    assert "deterministic" in line and "changed while this run" not in line


def test_a_model_with_no_inputs(digits, capsys):
    config = digits(model="constant.onnx")
    value = numpy_helper.from_array(np.ones((1, 10), np.float32))
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["y"], value=value)],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), config.parent / "constant.onnx")
    assert main(["check", str(config)]) == 2
    err = capsys.readouterr().err
    assert "constant.onnx" in err and "no inputs" in err and "cache" not in err, err


def test_a_full_output_disk_names_the_output(digits, tmpfs):
    disk = tmpfs("out", "200k")  # the run's records fit, best/model.onnx (626 KB) does not
    done = quantune("run", str(digits(executor__kind="inline")), "-q", "-o", str(disk / "out"), cwd=disk.parent)
    line = one_line(done, 1, "No space left", str(disk))
    assert "cache" not in line


def test_a_full_cache_disk_stops_the_run_naming_the_cache(digits, tmpfs):
    """onnxruntime's model writers stop short without an error on a full disk; the pass then
    failed reading its own copy ("Wire format was corrupt") and every later trial the same."""
    disk = tmpfs("cache", "1600k")
    config = digits(executor__kind="inline", cache_dir=str(disk / "cache"), stop__max_trials=6)
    done = quantune("run", str(config), "-q", "-o", "out", cwd=config.parent)
    line = one_line(done, 1, "No space left", str(disk))
    assert "Wire format" not in line


def test_a_copy_error_names_its_destination():
    """shutil's copy reports ENOSPC with the source first and the (full) destination second."""
    exc = OSError(errno.ENOSPC, "No space left on device", "/cache/model.onnx", None, "/out/best/model.onnx")
    assert written_path(exc) == "/out/best/model.onnx"
