"""Other frameworks' models as a run's input, converted to ONNX once and cached (PyTorch)."""

from __future__ import annotations

from quantune.convert.pytorch import describe_export, dynamic_axes, export_pytorch

__all__ = ["describe_export", "dynamic_axes", "export_pytorch"]
