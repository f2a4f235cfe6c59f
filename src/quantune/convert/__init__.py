"""Other frameworks' models as a run's input, converted to ONNX once and cached (PyTorch)."""

from __future__ import annotations

from quantune.convert.pytorch import dynamic_axes, export_pytorch, weights_sha256

__all__ = ["dynamic_axes", "export_pytorch", "weights_sha256"]
