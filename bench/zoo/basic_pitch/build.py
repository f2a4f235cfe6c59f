"""Spotify's Basic Pitch note model (``nmp.onnx``, basic-pitch 0.4.0, Apache-2.0) on synthesised music.

The model: a small conv net (harmonic CQT front end inside the graph) that maps 2 s of 22,050 Hz
mono audio ([batch, 43844, 1]) to per-frame note, onset and pitch-contour activations
([batch, 172, 88] twice, [batch, 172, 264]). The data is synthesised, not recorded: melodies
and chords of MIDI notes 40-90, each note a harmonic tone (6 partials, falling amplitudes)
with an attack/decay envelope, a little noise added; each window is its own seed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from zoolib import extract

PACKAGE = "basic-pitch==0.4.0"
FILES = ["model.onnx", "calib.npz", "eval.npz"]
RATE, SAMPLES = 22050, 43844


def tone(midi: int, seconds: float, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    frequency = 440.0 * 2 ** ((midi - 69) / 12)
    wave = sum((0.6**k) * np.sin(2 * np.pi * frequency * (k + 1) * t + rng.uniform(0, 6.28)) for k in range(6))
    envelope = np.minimum(t / 0.01, 1.0) * np.exp(-t * rng.uniform(1.0, 4.0))
    return wave * envelope


def window(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    audio = np.zeros(SAMPLES + RATE)
    start = 0.0
    while start < SAMPLES / RATE:
        length = rng.choice([0.125, 0.25, 0.5])
        root = int(rng.integers(40, 80))
        notes = [root] if rng.random() < 0.6 else [root, root + 4, root + 7]
        for note in notes:
            piece = tone(note, length * 1.5, rng)
            begin = int(start * RATE)
            audio[begin : begin + len(piece)] += piece[: len(audio) - begin]
        start += length
    audio = audio[:SAMPLES]
    audio = audio / np.max(np.abs(audio)) * 0.8 + rng.normal(0, 0.005, SAMPLES)
    return audio.astype(np.float32)[:, None]


def build(target: Path) -> list[str]:
    extract(PACKAGE, "saved_models/icassp_2022/nmp.onnx", target / "model.onnx")
    np.savez(target / "eval.npz", **{"serving_default_input_2:0": np.stack([window(s) for s in range(48)])})
    np.savez(target / "calib.npz", **{"serving_default_input_2:0": np.stack([window(s) for s in range(1000, 1016)])})
    return FILES
