"""The digits CNN in PyTorch, for ``torch_config.yaml`` (quantune's PyTorch input) and ``train.py``.

``build()`` returns the network with the weights of the bundled ``model.onnx`` (the ONNX
export of the trained network keeps the PyTorch parameter names), so tuning from PyTorch and
from ONNX starts from the same model. ``inputs()`` gives the example batch the export traces.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

HERE = Path(__file__).resolve().parent


class DigitsCNN(nn.Module):
    """Small CNN for 8x8 digits: three conv layers and two linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
            nn.Conv2d(64, 128, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 4x4 -> 2x2
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),  # 128 * 2 * 2 = 512
            nn.Linear(512, 128),
            nn.ReLU(),
            nn.Linear(128, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def build() -> nn.Module:
    """The trained network: its weights read from ``model.onnx`` by parameter name."""
    model = DigitsCNN()
    weights = {init.name: numpy_helper.to_array(init) for init in onnx.load(str(HERE / "model.onnx")).graph.initializer}
    model.load_state_dict({name: torch.from_numpy(weights[name].copy()) for name in model.state_dict()})
    return model.eval()


def inputs() -> dict[str, np.ndarray]:
    """One example batch, named as the data's array (``input``): 64 evaluation images."""
    with np.load(HERE / "eval.npz") as data:
        return {"input": data["input"][:64]}
