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

from robust_helpers import kill_session, make_project, quantune, start_run, stored_trials, wait_for

SLOW_LATENCY = {"metric": "top1", "latency": {"warmup": 1, "repeats": 600, "threads": 1, "confirm_top": 0}}


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
    config = make_project(tmp_path / "project", max_trials=30, evaluation=SLOW_LATENCY)
    output = disk / "out" if where == "output" else tmp_path / "out"
    if where == "cache":
        _edit(config, cache_dir=str(disk / "cache"))
    proc = start_run(config, output)
    try:
        wait_for(lambda: stored_trials(output) >= 2, process=proc, what="two trials")
        filler = _fill(disk)
        _, err = proc.communicate(timeout=300)
    finally:
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
    assert final["replayed_trials"] == kept and len(final["trials"]) == 30
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
