"""One AdaRound step (forward + backward of a sampled Conv layer) in numpy and in PyTorch, timed
side by side, to decide whether fast_finetune needs torch.

    python bench/finetune_numpy_vs_torch.py

The layer is the scaled CNN's largest (features.5: 64 -> 128 channels, 3x3, so K = 576), 1024
sampled output positions a step (fast_finetune's ``ROWS_PER_STEP``), one thread each
(numpy's BLAS limited with threadpoolctl, ``torch.set_num_threads(1)``). Rounds alternate
numpy / torch so load on the machine hits both alike; the ratio of medians is printed.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

K, OUT, R, STEPS, ROUNDS = 576, 128, 1024, 50, 5


def numpy_step(patches, target, v, floor, scale) -> np.ndarray:
    sig = 1.0 / (1.0 + np.exp(-v))
    h = np.clip(sig * 1.2 - 0.1, 0, 1)
    w = ((floor + h) * scale).astype(np.float32)
    out = np.maximum(patches @ w.T, 0)
    grad = (2.0 * (out - target) / out.size * (out > 0)).astype(np.float32)
    grad_w = grad.T @ patches
    return grad_w * scale * 1.2 * sig * (1 - sig)


def main() -> int:
    try:
        import torch
    except ImportError:
        print("torch is not installed (pip install torch==2.13.0 for a CPU build)")
        return 1
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    patches = rng.normal(size=(R, K)).astype(np.float32)
    target = np.maximum(rng.normal(size=(R, OUT)), 0).astype(np.float32)
    weight = rng.normal(0, 0.05, (OUT, K))
    scale = 0.002
    floor = np.floor(weight / scale)
    v = rng.normal(size=(OUT, K))
    tp, tt = torch.from_numpy(patches), torch.from_numpy(target)
    tv = torch.tensor(v, dtype=torch.float32, requires_grad=True)
    tfloor = torch.tensor(floor, dtype=torch.float32)

    def torch_step() -> None:
        h = torch.clamp(torch.sigmoid(tv) * 1.2 - 0.1, 0, 1)
        out = torch.relu(tp @ ((tfloor + h) * scale).T)
        loss = torch.mean((out - tt) ** 2)
        tv.grad = None
        loss.backward()

    times: dict[str, list[float]] = {"numpy": [], "torch": []}
    with threadpool_limits(limits=1, user_api="blas"):
        for _ in range(ROUNDS):
            start = time.perf_counter()
            for _ in range(STEPS):
                numpy_step(patches, target, v, floor, scale)
            times["numpy"].append((time.perf_counter() - start) / STEPS * 1000)
            start = time.perf_counter()
            for _ in range(STEPS):
                torch_step()
            times["torch"].append((time.perf_counter() - start) / STEPS * 1000)
    med = {name: statistics.median(values) for name, values in times.items()}
    print(f"ms per step (median of {ROUNDS} rounds of {STEPS}): numpy {med['numpy']:.2f}, torch {med['torch']:.2f}")
    print(f"numpy / torch = {med['numpy'] / med['torch']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
