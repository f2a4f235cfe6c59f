"""Full disks and read-only folders under the output folder and the cache, on real file systems.

A small tmpfs (``mount -t tmpfs -o size=...``) is filled by the test in the middle of a real
``quantune run``; read-only is a read-only mount (root ignores chmod). Both need root's right to
mount: without it these tests are skipped with that reason.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from robust_helpers import LaneGate, counted, kill_session, make_project, quantune, start_run, stored_trials


@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    mounted: list[Path] = []

    def mount(name: str, size: str = "8m", *, read_only: bool = False) -> Path:
        point = tmp_path / name
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip() or 'not permitted'})")
        mounted.append(point)
        if read_only:
            (point / "folder").mkdir()
            subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)
        return point

    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def _fill(folder: Path) -> Path:
    """Writes ``folder``/filler until the file system is full; returns the filler's path."""
    filler = folder / "filler"
    with contextlib.suppress(OSError), open(filler, "wb", buffering=0) as handle:
        for chunk in (65536, 512):  # big blocks, then the last partial ones
            with contextlib.suppress(OSError):
                while True:
                    handle.write(b"\0" * chunk)
    return filler


def _one_line_error(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.startswith("quantune: error:")]
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    return lines[0]


def _edit(config: Path, **changes) -> None:
    data = yaml.safe_load(config.read_text())
    data.update(changes)
    config.write_text(yaml.safe_dump(data))


@pytest.mark.parametrize("where", ["output", "cache"])
def test_a_disk_filling_up_mid_run_stops_it_with_one_line_and_the_run_resumes(tmp_path, mount_tmpfs, where):
    disk = mount_tmpfs("disk", "16m")
    config = make_project(tmp_path / "project", max_trials=30)
    output = disk / "out" if where == "output" else tmp_path / "out"
    if where == "cache":
        _edit(config, cache_dir=str(disk / "cache"))
    # mid-run by events: two trials stored, the third waiting at its timing for the lane the test holds
    assert quantune("check", str(config), cwd=config.parent).returncode == 0  # the original, cached
    gate = LaneGate().__enter__()
    proc = start_run(config, output)
    try:
        while stored_trials(output) < 2:
            gate.let_one_through(proc)
        gate.wait_for_a_timing(proc)
        filler = _fill(disk)
        gate.__exit__()
        _, err = proc.communicate(timeout=600)
    finally:
        gate.__exit__()
        if proc.poll() is None:
            kill_session(proc.pid)
    assert proc.returncode == 1, err
    line = _one_line_error(err)
    assert "No space left on device writing" in line and str(disk) in line
    kept = stored_trials(output)
    assert kept >= 2
    results = json.loads((output / "results.json").read_text()) if (output / "results.json").exists() else None
    assert results is None or all(t["status"] == "ok" for t in results["trials"])

    filler.unlink()
    resumed = quantune("run", str(config), "--output", str(output), "--quiet", cwd=config.parent)
    assert resumed.returncode == 0, resumed.stderr
    final = json.loads((output / "results.json").read_text())
    assert final["replayed_trials"] == kept and counted(final["trials"]) == 30
    # no trial failed for the disk's sake: the trial in flight ran again on resume
    assert not [t for t in final["trials"] if t["status"] == "failed"]


def test_a_full_disk_under_the_output_folder_at_start_leaves_nothing_behind(tmp_path, mount_tmpfs):
    disk = mount_tmpfs("disk", "1m")
    config = make_project(tmp_path / "project", max_trials=2, executor={"kind": "inline"})
    filler = _fill(disk)
    done = quantune("run", str(config), "--output", str(disk / "out"), "--quiet", cwd=config.parent)
    assert done.returncode == 1, done.stderr
    assert "No space left on device writing" in _one_line_error(done.stderr)
    assert not (disk / "out").exists()
    filler.unlink()
    again = quantune("run", str(config), "--output", str(disk / "out"), "--quiet", cwd=config.parent)
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("where", ["output", "cache"])
def test_a_read_only_folder_is_named_in_one_line_with_exit_2(tmp_path, mount_tmpfs, where):
    disk = mount_tmpfs("ro", "1m", read_only=True)
    config = make_project(tmp_path / "project", max_trials=2, executor={"kind": "inline"})
    output = disk / "folder" if where == "output" else tmp_path / "out"
    if where == "cache":
        _edit(config, cache_dir=str(disk / "folder"))
    done = quantune("run", str(config), "--output", str(output), "--quiet", cwd=config.parent)
    assert done.returncode == 2, done.stderr
    line = _one_line_error(done.stderr)
    assert ("--output" if where == "output" else "cache_dir") in line
    assert "not writable" in line and "Read-only file system" in line
    assert not (tmp_path / "out").exists()  # a setup failure claims no output folder


def test_report_writes_into_a_new_folder_or_says_why_not(tmp_path):
    config = make_project(tmp_path / "project", max_trials=2, executor={"kind": "inline"})
    output = tmp_path / "out"
    assert quantune("run", str(config), "--output", str(output), "--quiet", cwd=tmp_path).returncode == 0
    page = tmp_path / "missing" / "dir" / "report.html"
    done = quantune("report", str(output), "--output", str(page), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert page.read_text().startswith("<!")
    (tmp_path / "afile").write_text("x")
    refused = quantune("report", str(output), "--output", str(tmp_path / "afile" / "r.html"), cwd=tmp_path)
    assert refused.returncode == 2
    assert "report --output" in _one_line_error(refused.stderr)
    shutil.rmtree(tmp_path / "missing")


# -- the cache: every entry verified by its hash when read ------------------------------------


def test_an_altered_evaluation_or_reference_entry_is_never_read_as_valid(tmp_path):
    import numpy as np

    from quantune.store import ArtifactCache

    cache = ArtifactCache(tmp_path / "cache")
    cache.put_json("evals", "k", {"metrics": {"top1": 0.5}})
    path = tmp_path / "cache" / "evals" / "k.json"
    path.write_text(path.read_text().replace("0.5", "0.9"))  # still valid JSON, other content
    assert cache.get_json("evals", "k") is None and not path.exists()

    cache.put_arrays("r", {"y": np.arange(4.0)})
    assert np.array_equal(cache.get_arrays("r")["y"], np.arange(4.0))
    archive = dict(np.load(tmp_path / "cache" / "outputs" / "r.npz"))
    archive["y"] = archive["y"] * 2
    np.savez(tmp_path / "cache" / "outputs" / "r.npz", **archive)  # content changed, old hash kept
    assert cache.get_arrays("r") is None


@pytest.mark.parametrize("kind", ["evals", "outputs", "models"])
def test_an_entry_cut_short_is_never_read_as_valid(tmp_path, kind):
    import numpy as np

    from quantune.store import ArtifactCache

    cache = ArtifactCache(tmp_path / "cache")
    if kind == "evals":
        path, read = tmp_path / "cache" / "evals" / "k.json", lambda: cache.get_json("evals", "k")

        def put():
            cache.put_json("evals", "k", {"metrics": {"top1": 0.5}})
    elif kind == "outputs":
        path, read = tmp_path / "cache" / "outputs" / "k.npz", lambda: cache.get_arrays("k")

        def put():
            cache.put_arrays("k", {"y": np.arange(1000.0)})
    else:
        from conftest import build_cnn

        path, read = (
            tmp_path / "cache" / "models" / "k" / "model.onnx",
            lambda: ArtifactCache(cache.root).get_model("k"),
        )

        def put():
            work = cache.new_work_dir()
            build_cnn(work / "model.onnx")
            cache.put_model("k", work, {"pass": "test"})

    put()
    data = path.read_bytes()
    for cut in (0, len(data) // 2, len(data) - 1):
        put()
        assert read() is not None
        path.write_bytes(data[:cut])  # as a write stopped by a full disk or a kill would leave it
        assert read() is None


def test_a_failed_cache_write_on_a_full_disk_raises_diskfull_and_leaves_no_entry(tmp_path, mount_tmpfs):
    import numpy as np

    from quantune.errors import DiskFull
    from quantune.store import ArtifactCache

    disk = mount_tmpfs("disk", "1m")
    cache = ArtifactCache(disk / "cache")
    filler = _fill(disk)
    with pytest.raises(DiskFull, match="No space left on device writing"):
        cache.put_arrays("k", {"y": np.zeros(100_000)})
    with pytest.raises(DiskFull):
        cache.put_json("evals", "k", {"metrics": {"blob": "x" * 200_000}})
    leftovers = [p for p in (disk / "cache").rglob("*") if p.is_file()]
    assert leftovers == []
    filler.unlink()
    cache.put_arrays("k", {"y": np.zeros(10)})
    assert cache.get_arrays("k") is not None
