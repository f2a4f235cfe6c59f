"""DNSMOS P.835 (``dnsmos_models/sig_bak_ovr.onnx`` from speechmos 0.0.1.1, MIT) on 9 s clips of
synthesised noisy voice: a speech-quality conv net that computes its own log-mel features from
raw 16 kHz audio, so one clip is 144,160 samples and one run at batch 1 takes some 0.3 s.

The model: raw audio [N, 144160] -> (signal, background, overall) raw MOS [N, 3] (speechmos
maps these through fixed polynomials afterwards; the raw figures are compared here). The data:
the voice of ``dfn_enc`` (harmonics of a gliding pitch through three formants, syllable-like
bursts) at 16 kHz, mixed with white or low-passed noise at -5 to 30 dB SNR and a random gain,
so the clips span bad to clean speech.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from zoolib import extract

PACKAGE = "speechmos==0.0.1.1"
FILES = ["model.onnx", "calib.npz", "eval.npz"]
RATE, SAMPLES = 16000, 144160


def clip(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(SAMPLES) / RATE
    pitch = rng.uniform(90, 260) * (1 + 0.15 * np.sin(2 * np.pi * rng.uniform(0.5, 2) * t))
    phase = 2 * np.pi * np.cumsum(pitch) / RATE
    formants = rng.uniform([500, 1200, 2400], [800, 1800, 3200])
    source = np.zeros(SAMPLES)
    for k in range(1, 30):
        frequency = k * pitch
        gain = sum(np.exp(-(((frequency - f) / 150.0) ** 2)) for f in formants) + 0.05
        source += gain * np.sin(k * phase) * (frequency < RATE / 2)
    syllables = (np.sin(2 * np.pi * rng.uniform(2, 5) * t) > -0.3).astype(float)
    speech = source * np.convolve(syllables, np.ones(320) / 320, mode="same")
    speech /= np.max(np.abs(speech)) + 1e-9
    noise = rng.normal(0, 1, SAMPLES)
    if rng.random() < 0.5:  # low-passed noise (hum, fan) for half the clips
        noise = np.convolve(noise, np.ones(16) / 4, mode="same")
    snr = rng.uniform(-5, 30)
    noise *= np.sqrt(np.mean(speech**2) / np.mean(noise**2) / 10 ** (snr / 10))
    mixed = speech + noise
    return (rng.uniform(0.1, 0.9) * mixed / np.max(np.abs(mixed))).astype(np.float32)


def build(target: Path) -> list[str]:
    extract(PACKAGE, "speechmos/dnsmos_models/sig_bak_ovr.onnx", target / "model.onnx")
    np.savez(target / "eval.npz", input_1=np.stack([clip(s) for s in range(48)]))
    np.savez(target / "calib.npz", input_1=np.stack([clip(s) for s in range(1000, 1016)]))
    return FILES
