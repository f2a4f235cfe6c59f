"""What ``quantune init --data ...`` was given, and how the starter config will read it: ``.npz``
files named after every input as they are, anything else through a written ``data.py`` loader."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from quantune.errors import QuantuneError
from quantune.starter.model_info import ModelInfo

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
LABEL_NAMES = ("label", "labels", "target", "targets", "y")


@dataclass
class DataSource:
    """``kind``: npz (read directly), images, samples (one .npy per sample), arrays (named
    arrays in .npy/.npz files mapped onto the inputs), synthetic (nothing given)."""

    kind: str
    files: list[Path] = field(default_factory=list)
    calibration: Path | None = None  # npz: the files named in the config
    evaluation: Path | None = None
    mapping: dict[str, tuple[Path, str | None]] = field(default_factory=dict)  # arrays: name -> (file, npz key)
    labels: bool = False
    label_dirs: list[str] = field(default_factory=list)  # images/samples: class folder names, sorted
    root: Path | None = None  # images/samples: the folder given

    @property
    def direct(self) -> bool:
        return self.kind == "npz"


def classify(given: list[str], info: ModelInfo) -> DataSource:
    """Decides how the data in ``given`` (files or one folder) will be read."""
    if not given:
        return DataSource("synthetic")
    paths = [Path(item).expanduser() for item in given]
    for path in paths:
        if not path.exists():
            raise QuantuneError(f"init --data: no file or folder at '{path}'")
    root = paths[0] if len(paths) == 1 and paths[0].is_dir() else None
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root else paths
    suffixes = {p.suffix.lower() for p in files}
    if root is not None and files and suffixes <= IMAGE_SUFFIXES | {".txt", ".json", ".csv", ""}:
        images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
        if images:
            return _images(root, images, info)
    npz = [p for p in files if p.suffix.lower() == ".npz"]
    npy = [p for p in files if p.suffix.lower() == ".npy"]
    if not npz and not npy:
        found = ", ".join(sorted(s or "(no suffix)" for s in suffixes)) or "no files"
        raise QuantuneError(
            f"init --data: found {found}; give a folder of images, .npy files or .npz files (or nothing, "
            "for a synthetic loader to edit)"
        )
    names = [spec.name for spec in info.inputs]
    if npz and not npy and all(set(names) <= set(_keys(p)) for p in npz) and len(npz) <= 2:
        return _direct(npz)
    return _arrays(npz + npy, info, root)


def _keys(path: Path) -> list[str]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            return list(archive.files)
    except Exception as exc:
        raise QuantuneError(f"init --data: '{path}' is not a readable .npz file ({exc})") from None


def _direct(npz: list[Path]) -> DataSource:
    """One file: calibration and evaluation both (the comment says to split); two: by name."""
    if len(npz) == 1:
        calib = evaluation = npz[0]
    else:
        first, second = npz
        calib, evaluation = (second, first) if _looks_like_calibration(second) else (first, second)
    labels = any(key in _keys(evaluation) for key in LABEL_NAMES[:1])
    return DataSource("npz", files=list(npz), calibration=calib, evaluation=evaluation, labels=labels)


def _looks_like_calibration(path: Path) -> bool:
    return "calib" in path.stem.lower() or "train" in path.stem.lower()


def _images(root: Path, images: list[Path], info: ModelInfo) -> DataSource:
    dirs = sorted({p.relative_to(root).parts[0] for p in images if len(p.relative_to(root).parts) > 1})
    in_dirs = all(len(p.relative_to(root).parts) > 1 for p in images)
    if not info.image_like:
        inputs = ", ".join(spec.describe() for spec in info.inputs)
        raise QuantuneError(
            f"init --data: '{root}' holds images, but the model takes {inputs}, not one image tensor "
            "[N, C, H, W] or [N, H, W, C]; give .npy/.npz arrays named after its inputs"
        )
    return DataSource(
        "images", files=images, root=root, labels=in_dirs and len(dirs) > 1, label_dirs=dirs if in_dirs else []
    )


def _arrays(files: list[Path], info: ModelInfo, root: Path | None) -> DataSource:
    """Named arrays (``input_ids.npy``, or .npz keys) mapped onto the inputs; else, for a
    one-input model, one .npy per sample."""
    available: list[tuple[str, Path, str | None]] = []
    for path in files:
        if path.suffix.lower() == ".npy":
            available.append((path.stem, path, None))
        else:
            available.extend((key, path, key) for key in _keys(path))
    names = [spec.name for spec in info.inputs]
    by_name = {name: (path, key) for name, path, key in available}
    if set(names) <= set(by_name):
        mapping = {name: by_name[name] for name in names}
        label = next((n for n in LABEL_NAMES if n in by_name), None)
        if label is not None:
            mapping["label"] = by_name[label]
        return DataSource("arrays", files=files, mapping=mapping, labels=label is not None, root=root)
    npy = [p for p in files if p.suffix.lower() == ".npy"]
    if len(names) == 1 and npy and len(npy) == len(files):
        rel = [p.relative_to(root).parts if root else (p.name,) for p in npy]
        dirs = sorted({parts[0] for parts in rel if len(parts) > 1})
        labelled = all(len(parts) > 1 for parts in rel) and len(dirs) > 1
        return DataSource("samples", files=npy, root=root, labels=labelled, label_dirs=dirs if labelled else [])
    if len(available) == len(names) == 1:  # one array, one input: whatever its name
        return DataSource("arrays", files=files, mapping={names[0]: available[0][1:]}, root=root)
    have = sorted(name for name, _, _ in available)
    raise QuantuneError(
        f"init --data: the arrays {have[:8]}{' ...' if len(have) > 8 else ''} do not name the model's inputs "
        f"{names}; name the .npy files (or .npz keys) after them, e.g. {names[0]}.npy"
    )
