"""Issue 26 (item 12): what ``quantune init --data images/`` writes runs with what installing
quantune brings -- or says the one command that makes it run (Pillow is the ``images`` extra)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import build_cnn
from quantune.cli import main
from quantune.starter import init_project

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(3)
    for label in ("cats", "dogs"):
        (tmp_path / "photos" / label).mkdir(parents=True)
        for index in range(4):
            image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(
                tmp_path / "photos" / label / f"{index}.png"
            )
    return tmp_path / "photos"


def test_without_pillow_check_names_the_install_command(tmp_path, photos, monkeypatch, capsys):
    model = build_cnn(tmp_path / "cnn.onnx")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "PIL" else find_spec(name, *a))
    result = init_project(model, [str(photos)], None, tmp_path / "project" / "quantune.yaml")
    assert any("pip install 'quantune[images]'" in note for note in result.notes), result.notes
    monkeypatch.setitem(sys.modules, "PIL", None)  # as on a fresh install: `import PIL` fails
    assert main(["check", str(tmp_path / "project" / "quantune.yaml")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "pip install 'quantune[images]'" in err and "No module named 'PIL'" not in err, err


def test_the_images_extra_brings_pillow():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^images = \["Pillow>=[\d.]+"\]', text, re.MULTILINE), "no images extra with Pillow"
