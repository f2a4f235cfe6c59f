"""The rendered pages as feeds: one dict per page, x [1, 3, H, W] (H, W multiples of 32)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from zoolib import load_feeds

HERE = Path(__file__).resolve().parent


def evaluation() -> list[dict]:
    return load_feeds(HERE / "eval_feeds.npz")


def calibration() -> list[dict]:
    return load_feeds(HERE / "calib_feeds.npz")
