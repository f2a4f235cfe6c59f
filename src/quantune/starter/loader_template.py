"""The ``data.py`` that ``quantune init`` writes when quantune cannot read the data as it is.

Plain Python the user owns and edits: constants filled from the model and ``--data``, the
preprocessing marked ``EDIT``, and ``calibration()`` and ``evaluation()`` named in the config.
"""

from __future__ import annotations

import os
from pathlib import Path

from quantune.starter.data_source import DataSource
from quantune.starter.model_info import ModelInfo, TensorInfo

HEADER = '''"""Data for quantune, written by `quantune init` for {model}. Edit it: it is yours.

The model's inputs:
{inputs}
quantune calls calibration() and evaluation() (named in quantune.yaml) with no arguments. Each
returns a dict of equal-length arrays (a table: array name -> array whose first axis is the
rows; quantune cuts it into batches of data.batch_size) or a list of such dicts (feeds: each
run as it is, for inputs whose shapes differ). Array names are the model's input names, plus
"label" (class indices) when the metric needs labels. Return the same data on every call
(seed anything random): a run's identity includes what the loader returns.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DTYPES = {dtypes}  # model input -> element type
BATCH = {batch}  # the model's fixed batch size (None: free)
CALIBRATION_EVERY = 4  # every 4th sample calibrates the quantizer; the others evaluate


def _split(items: list) -> tuple[list, list]:
    """Calibration and evaluation parts, disjoint when there are two samples or more."""
    calibration = items[::CALIBRATION_EVERY]
    evaluation = [item for index, item in enumerate(items) if index % CALIBRATION_EVERY]
    return calibration, evaluation or calibration


def _pack(samples: list[dict]) -> dict | list[dict]:
    """Samples (each array with a leading axis of 1) as one table when their shapes agree,
    else as feeds, one per sample."""
    kinds = {{tuple((k, v.shape[1:], v.dtype.str) for k, v in sample.items()) for sample in samples}}
    if len(kinds) > 1 and BATCH in (None, 1):
        return samples
    table = {{key: np.concatenate([sample[key] for sample in samples]) for key in samples[0]}}
    return _fit_batch(table)


def _fit_batch(table: dict) -> dict:
    """A fixed batch size needs whole batches: drop the rows past the last full one."""
    rows = len(next(iter(table.values())))
    keep = rows if not BATCH else max(BATCH, rows - rows % BATCH)
    return {{key: value[:keep] for key, value in table.items()}}
'''

IMAGES = '''
IMAGES = HERE / {root!r}
INPUT = {input!r}
LAYOUT = {layout!r}  # from the model: where the channels are
CHANNELS = {channels}
SIZE = {size}  # (height, width) every image is resized to; None keeps each image's size
CLASSES = {classes}  # sub-folders, in order: label 0, 1, ... (empty: no labels)


def preprocess(image) -> np.ndarray:
    """A PIL image -> float32 {shape}. EDIT: your model's own preprocessing."""
    image = image.convert("RGB" if CHANNELS == 3 else "L")
    if SIZE is not None:
        image = image.resize((SIZE[1], SIZE[0]))
    array = np.asarray(image, dtype=np.float32) / 255.0  # EDIT: e.g. (array - mean) / std, or BGR order
    if array.ndim == 2:
        array = array[:, :, None]
    return array.transpose(2, 0, 1) if LAYOUT == "NCHW" else array


def _samples() -> list[dict]:
    try:
        from PIL import Image
    except ImportError:  # Pillow is not among quantune's own dependencies
        raise ModuleNotFoundError(
            "reading images needs Pillow, which is not installed: pip install 'quantune[images]' (or pip install pillow)"
        ) from None

    files = sorted(p for p in IMAGES.rglob("*") if p.suffix.lower() in {suffixes!r})
    samples = []
    for path in files:
        with Image.open(path) as image:
            sample = {{INPUT: preprocess(image)[None].astype(DTYPES[INPUT])}}
        if CLASSES:
            sample["label"] = np.array([CLASSES.index(path.relative_to(IMAGES).parts[0])], np.int64)
        samples.append(sample)
    return samples


def calibration() -> dict | list[dict]:
    return _pack(_split(_samples())[0])


def evaluation() -> dict | list[dict]:
    return _pack(_split(_samples())[1])
'''

SAMPLES = """
SAMPLES = HERE / {root!r}  # one .npy per sample
INPUT = {input!r}
RANK = {rank}  # the model input's rank; a sample one axis short gets a batch axis of 1
CLASSES = {classes}  # sub-folders, in order: label 0, 1, ... (empty: no labels)


def _samples() -> list[dict]:
    samples = []
    for path in sorted(SAMPLES.rglob("*.npy")):
        array = np.load(path, allow_pickle=False)  # EDIT: preprocessing, if the files hold raw data
        if array.ndim == RANK - 1:
            array = array[None]
        sample = {{INPUT: array.astype(DTYPES[INPUT])}}
        if CLASSES:
            sample["label"] = np.array([CLASSES.index(path.relative_to(SAMPLES).parts[0])] * len(array), np.int64)
        samples.append(sample)
    return samples


def calibration() -> dict | list[dict]:
    return _pack(_split(_samples())[0])


def evaluation() -> dict | list[dict]:
    return _pack(_split(_samples())[1])
"""

ARRAYS = """
# model input (and "label") -> (file, key in an .npz file or None for an .npy file); every array's
# first axis is the rows
ARRAYS = {mapping}


def _table() -> dict:
    table = {{}}
    for name, (file, key) in ARRAYS.items():
        if key is None:
            array = np.load(HERE / file, allow_pickle=False)
        else:
            with np.load(HERE / file, allow_pickle=False) as archive:
                array = archive[key]
        table[name] = array.astype(DTYPES[name]) if name in DTYPES else array  # EDIT: preprocessing
    return table


def _rows(table: dict, part: int) -> dict:
    rows = len(next(iter(table.values())))
    index = np.arange(rows)
    chosen = index[index % CALIBRATION_EVERY == 0] if part == 0 else index[index % CALIBRATION_EVERY != 0]
    if len(chosen) == 0:
        chosen = index
    return _fit_batch({{key: value[chosen] for key, value in table.items()}})


def calibration() -> dict:
    return _rows(_table(), 0)


def evaluation() -> dict:
    return _rows(_table(), 1)
"""

SYNTHETIC = """
# No data was given: random inputs of the model's shapes, so `quantune check` and a first run work.
# EDIT: load your own data instead -- quantization calibrated on random data is a placeholder, and
# an agreement metric on random inputs says little about accuracy on real ones.
ROWS = 64  # rows of each part
SIZES = {sizes}  # free dimensions -> size used here (EDIT to your data's)
SHAPES = {shapes}  # model input -> dims (ints, or names in SIZES)
RANGES = {ranges}  # integer inputs -> (low, high) of the values drawn (e.g. token ids < vocabulary)


def _table(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    rows = BATCH or ROWS
    table = {{}}
    for name, dims in SHAPES.items():
        shape = [rows] + [SIZES.get(d, d) if isinstance(d, str) else d for d in dims[1:]]
        if np.dtype(DTYPES[name]).kind == "f":
            table[name] = rng.random(shape).astype(DTYPES[name])
        elif np.dtype(DTYPES[name]).kind == "b":
            table[name] = np.ones(shape, dtype=bool)
        else:
            low, high = RANGES.get(name, (0, 2))
            table[name] = rng.integers(low, high, size=shape).astype(DTYPES[name])
    return table


def calibration() -> dict:
    return _table(seed=0)


def evaluation() -> dict:
    return _table(seed=1)
"""


def render_loader(info: ModelInfo, source: DataSource, folder: Path) -> str:
    """The ``data.py`` text for ``source``; file paths in it are relative to ``folder`` (where it is written)."""
    inputs = "\n".join(f"    {spec.describe()}" for spec in info.inputs)
    dtypes = {spec.name: spec.dtype for spec in info.inputs}
    batch = _shared_batch(info.inputs)
    text = HEADER.format(model=info.path.name, inputs=inputs, dtypes=dtypes, batch=batch)
    suffixes = sorted({p.suffix.lower() for p in source.files})
    if source.kind == "images":
        spec = info.inputs[0]
        assert spec.dims is not None
        layout = "NCHW" if spec.dims[1] in (1, 3) else "NHWC"
        spatial = spec.dims[2:4] if layout == "NCHW" else spec.dims[1:3]
        size = tuple(spatial) if all(isinstance(d, int) for d in spatial) else None
        channels = spec.dims[1] if layout == "NCHW" else spec.dims[3]
        shape = "[C, H, W]" if layout == "NCHW" else "[H, W, C]"
        return text + IMAGES.format(
            root=_rel(source.root, folder),
            input=spec.name,
            layout=layout,
            channels=channels,
            size=size,
            classes=source.label_dirs if source.labels else [],
            shape=shape,
            suffixes=suffixes,
        )
    if source.kind == "samples":
        spec = info.inputs[0]
        root = source.root if source.root is not None else source.files[0].parent
        return text + SAMPLES.format(
            root=_rel(root, folder),
            input=spec.name,
            rank=len(spec.dims) if spec.dims is not None else 0,
            classes=source.label_dirs if source.labels else [],
        )
    if source.kind == "arrays":
        mapping = {name: (_rel(path, folder), key) for name, (path, key) in source.mapping.items()}
        return text + ARRAYS.format(mapping=_pretty(mapping))
    sizes, shapes, ranges = _synthetic_shapes(info)
    return text + SYNTHETIC.format(sizes=sizes, shapes=_pretty(shapes), ranges=ranges)


def _shared_batch(inputs: list[TensorInfo]) -> int | None:
    fixed = {spec.batch_fixed for spec in inputs}
    return fixed.pop() if len(fixed) == 1 else None


def _rel(path: Path | None, folder: Path) -> str:
    assert path is not None
    return os.path.relpath(path.resolve(), folder.resolve())


def _pretty(mapping: dict) -> str:
    if not mapping:
        return "{}"
    lines = [f"    {key!r}: {value!r}," for key, value in mapping.items()]
    return "{\n" + "\n".join(lines) + "\n}"


def _synthetic_shapes(info: ModelInfo) -> tuple[dict, dict, dict]:
    """Sizes for free dimensions (a name shared by several inputs is one size), each input's
    dims, and value ranges for integer inputs (ids below the table they index; masks of ones)."""
    sizes: dict[str, int] = {}
    shapes: dict[str, list] = {}
    ranges: dict[str, tuple[int, int]] = {}
    for spec in info.inputs:
        dims = list(spec.dims) if spec.dims is not None else [None, 16]
        for axis, dim in enumerate(dims[1:], start=1):
            if isinstance(dim, int):
                continue
            key = dim if isinstance(dim, str) else f"{spec.name}.dim{axis}"
            dims[axis] = key
            sizes.setdefault(key, _default_size(key, info, len(dims), axis))
        shapes[spec.name] = dims
        name = spec.name.lower()
        if spec.dtype.startswith(("int", "uint")):
            if spec.vocabulary:
                ranges[spec.name] = (0, spec.vocabulary)
            elif "mask" in name:
                ranges[spec.name] = (1, 2)
            elif "type" in name or "segment" in name:
                ranges[spec.name] = (0, 1)
    return sizes, shapes, ranges


def _default_size(key: str, info: ModelInfo, rank: int, axis: int) -> int:
    lowered = key.lower()
    if any(word in lowered for word in ("seq", "len", "token", "time", "step")):
        return 128
    if rank == 4 and info.image_like:
        return 1 if axis == 1 else 224
    return 16
