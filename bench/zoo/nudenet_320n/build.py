"""NudeNet's detector (``320n.onnx``, nudenet 3.4.2, AGPL-3.0 code / model shipped in the wheel):
a YOLOv8n (64 Conv, opset 17) with the DFL box head decoded in the graph (Softmax over 16 bins
-> a fixed 1x1 Conv -> distances -> boxes times the strides), 18 classes of exposed or covered
body parts and faces.

The data: views of real photographs (``photos.scene``: scikit-image's astronaut, camera,
coffee, chelsea, rocket, motorcycle and matplotlib's Grace Hopper, cropped, scaled, mirrored),
preprocessed as NudeNet does: padded to a square at the bottom/right with black, resized to
320x320, RGB / 255, CHW: [1, 3, 320, 320] each.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from photos import letterbox, scene
from zoolib import extract

PACKAGE = "nudenet==3.4.2"
FILES = ["model.onnx", "calib.npz", "eval.npz"]
SIZE = 320


def tensor(seed: int) -> np.ndarray:
    image = scene(seed)
    side = max(image.size)
    square = letterbox(image, (side, side), (0, 0, 0)).resize((SIZE, SIZE))
    return (np.asarray(square, dtype=np.float32) / 255.0).transpose(2, 0, 1)


def build(target: Path) -> list[str]:
    extract(PACKAGE, "nudenet/320n.onnx", target / "model.onnx")
    np.savez(target / "eval.npz", images=np.stack([tensor(seed) for seed in range(96)]))
    np.savez(target / "calib.npz", images=np.stack([tensor(seed) for seed in range(1000, 1016)]))
    return FILES
