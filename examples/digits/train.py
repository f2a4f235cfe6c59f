"""Train the bundled ``digits`` example model and write its data files.

Why this exists
---------------
``quantune`` searches onnxruntime quantization settings, and its demos and
end-to-end tests need a real model with real data: an FP32 ONNX classifier,
a calibration set for static quantization, and a labelled evaluation set to
measure how much accuracy each setting costs.  Fetching a model or a data set
from a hub at run time is not possible everywhere quantune runs, so this
example is built from scikit-learn's bundled ``digits`` data set (1797 real
8x8 images of handwritten digits with their labels), which ships inside the
``scikit-learn`` package.

The CNN is deliberately wider than the task needs, so that int8 quantization
gives a measurable CPU latency gain at batch 64, while the file stays well
under 1 MB.

Outputs (in ``--out``, by default this script's folder):

* ``model.onnx`` -- opset 17, input ``input`` float32 ``(batch, 1, 8, 8)``
  with pixels in [0, 1], output ``logits`` float32 ``(batch, 10)``;
  self-contained (no external data file).
* ``calib.npz`` -- first 256 images of the train split:
  ``input`` float32 ``(256, 1, 8, 8)``, ``label`` int64 ``(256,)``.
* ``eval.npz`` -- the whole test split:
  ``input`` float32 ``(N, 1, 8, 8)``, ``label`` int64 ``(N,)``.

Re-train (needs torch, onnx, onnxruntime, scikit-learn, numpy; none of them
is a dependency of quantune itself)::

    python examples/digits/train.py [--out DIR] [--epochs 35]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from net import DigitsCNN  # the network, shared with net.py:build (quantune's PyTorch input)
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

SEED = 0
BATCH_SIZE = 64
CALIB_SIZE = 256
OPSET = 17


def set_determinism(seed: int = SEED) -> None:
    """Fix every random seed and ask PyTorch for deterministic kernels."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


def load_splits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return ``(x_train, x_test, y_train, y_test)``.

    Images are float32 ``(N, 1, 8, 8)`` scaled from 0..16 to [0, 1];
    labels are int64.
    """
    digits = load_digits()
    images = (digits.images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=0.25, random_state=SEED, stratify=labels
    )
    return x_train, x_test, y_train, y_test


def train(model: nn.Module, x_train: np.ndarray, y_train: np.ndarray, epochs: int) -> None:
    """Train ``model`` in place with Adam and cross-entropy, batch 64."""
    xs = torch.from_numpy(x_train)
    ys = torch.from_numpy(y_train)
    generator = torch.Generator().manual_seed(SEED)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for epoch in range(1, epochs + 1):
        order = torch.randperm(len(xs), generator=generator)
        total_loss = 0.0
        for start in range(0, len(xs), BATCH_SIZE):
            idx = order[start : start + BATCH_SIZE]
            optimizer.zero_grad()
            loss = loss_fn(model(xs[idx]), ys[idx])
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * len(idx)
        if epoch == 1 or epoch % 5 == 0 or epoch == epochs:
            print(f"epoch {epoch:3d}  loss {total_loss / len(xs):.4f}")


@torch.no_grad()
def torch_accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy of ``model`` on ``(x, y)``."""
    model.eval()
    preds = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    return float((preds == y).mean())


def export_onnx(model: nn.Module, path: Path) -> None:
    """Export ``model`` to a single self-contained ONNX file at ``path``."""
    model.eval()
    dummy = torch.zeros(1, 1, 8, 8, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        # torch >= 2.9 warns that the TorchScript exporter is "legacy"; it is
        # still the simplest exporter for this plain CNN and needs no onnxscript.
        warnings.simplefilter("ignore", DeprecationWarning)
        tmp_path = Path(tmp) / "model.onnx"
        torch.onnx.export(
            model,
            (dummy,),
            str(tmp_path),
            opset_version=OPSET,
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
            dynamo=False,
        )
        # Reload with onnx so any external-data file the exporter may have
        # written is pulled back inside the protobuf.
        proto = onnx.load(str(tmp_path), load_external_data=True)
    onnx.save_model(proto, str(path), save_as_external_data=False)
    onnx.checker.check_model(str(path), full_check=True)


def onnx_accuracy(path: Path, x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy of the ONNX model at ``path`` with onnxruntime (CPU)."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], {"input": x})
    return float((np.asarray(logits).argmax(axis=1) == y).mean())


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent,
        help="output folder (default: this script's folder)",
    )
    parser.add_argument("--epochs", type=int, default=35, help="training epochs")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    set_determinism()

    x_train, x_test, y_train, y_test = load_splits()
    print(f"train {x_train.shape}  test {x_test.shape}")

    model = DigitsCNN()
    train(model, x_train, y_train, args.epochs)
    train_acc = torch_accuracy(model, x_train, y_train)
    test_acc = torch_accuracy(model, x_test, y_test)
    print(f"torch  train top-1 {train_acc:.4f}  test top-1 {test_acc:.4f}")

    model_path = out / "model.onnx"
    export_onnx(model, model_path)
    ort_acc = onnx_accuracy(model_path, x_test, y_test)
    print(f"onnxruntime test top-1 {ort_acc:.4f}")
    if ort_acc != test_acc:
        raise SystemExit(f"ONNX accuracy {ort_acc} differs from torch {test_acc}")
    print(f"wrote {model_path} ({os.path.getsize(model_path)} bytes)")

    np.savez_compressed(
        out / "calib.npz",
        input=np.ascontiguousarray(x_train[:CALIB_SIZE]),
        label=np.ascontiguousarray(y_train[:CALIB_SIZE]),
    )
    np.savez_compressed(
        out / "eval.npz",
        input=np.ascontiguousarray(x_test),
        label=np.ascontiguousarray(y_test),
    )
    print(f"wrote {out / 'calib.npz'} and {out / 'eval.npz'}")


if __name__ == "__main__":
    main()
