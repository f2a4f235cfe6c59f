"""Real photographs for the zoo's detectors, from packages that ship them as data.

scikit-image's wheel ships its ``skimage.data`` images (astronaut, camera, coffee, chelsea,
rocket, motorcycle, ...) and matplotlib's its ``sample_data/grace_hopper.jpg``: read straight
out of the archive (scikit-image is not installed) or out of the installed matplotlib.
``scene`` cuts varied views out of them (crop, scale, mirror) so a few photographs give a
few dozen different inputs, the same ones on every build (seeded).
"""

from __future__ import annotations

import io
import random
from pathlib import Path

from zoolib import member

SKIMAGE = "scikit-image==0.26.0"
PHOTOS = ("astronaut.png", "camera.png", "coffee.png", "chelsea.png", "rocket.jpg", "motorcycle_left.png")


def photo(name: str):
    """One photograph as an RGB PIL image: a ``skimage/data`` file name or ``grace_hopper.jpg``."""
    from PIL import Image

    if name == "grace_hopper.jpg":
        import matplotlib

        return Image.open(Path(matplotlib.get_data_path()) / "sample_data" / name).convert("RGB")
    return Image.open(io.BytesIO(member(SKIMAGE, f"skimage/data/{name}"))).convert("RGB")


def scene(seed: int, names: tuple[str, ...] = (*PHOTOS, "grace_hopper.jpg")):
    """A seeded view of one photograph: a crop of 55-100% of its sides, maybe mirrored."""
    from PIL import ImageOps

    rng = random.Random(seed)
    image = photo(names[seed % len(names)])
    w, h = image.size
    share = rng.uniform(0.55, 1.0)
    cw, ch = int(w * share), int(h * share)
    left, top = rng.randint(0, w - cw), rng.randint(0, h - ch)
    image = image.crop((left, top, left + cw, top + ch))
    return ImageOps.mirror(image) if rng.random() < 0.5 else image


def letterbox(image, size: tuple[int, int], fill: tuple[int, int, int], centre: bool = False):
    """``image`` scaled to fit ``size`` (w, h) keeping its ratio, padded with ``fill``
    (bottom/right as YOLOX and NudeNet pad; ``centre`` as Ultralytics does)."""
    from PIL import Image

    ratio = min(size[0] / image.width, size[1] / image.height)
    scaled = image.resize((max(1, round(image.width * ratio)), max(1, round(image.height * ratio))), Image.BILINEAR)
    canvas = Image.new("RGB", size, fill)
    offset = ((size[0] - scaled.width) // 2, (size[1] - scaled.height) // 2) if centre else (0, 0)
    canvas.paste(scaled, offset)
    return canvas
