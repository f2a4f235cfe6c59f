"""AdaRound and AdaQuant for one layer, in numpy: fit the quantized layer's output to the float one.

Both keep the layer's scales and zero points (so graph and speed are unchanged) and choose its
integer weights by minimising ``||f(x_q; W_q) - f_fp32(x)||^2`` over calibration rows, ``x_q``
the layer's input in the quantized model, ``f`` ending with the layer's ReLU when it has one.
**AdaRound** (Nagel et al., 2020) learns to round each weight down or up through a rectified
sigmoid with an annealed regulariser; **AdaQuant** (Hubara et al., 2021) trains the weights (in
quantization steps) and the bias through the rounding with a straight-through gradient. Each
step samples output positions, so its cost does not grow with the image size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ZETA, GAMMA = 1.1, -0.1
ROWS_PER_STEP = 1024
POOL_BYTES = 128 * 1024 * 1024  # im2col rows a Conv layer keeps to sample steps from
REG_WEIGHT = 0.01
WARMUP = 0.2
BETA = (20.0, 2.0)


class LayerOp:
    """``y = patches @ W.T + b`` over sampled output positions; subclasses say how to sample."""

    groups = 1

    def __init__(self, x: np.ndarray, target: np.ndarray, relu: bool) -> None:
        self.x, self.target, self.relu = x, target, relu

    def sample(self, rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """(patches [R, groups, K], targets [R, O])."""
        raise NotImplementedError

    def matrix(self, weight: np.ndarray) -> np.ndarray:
        """The weight as [groups, O / groups, K]."""
        raise NotImplementedError

    def unmatrix(self, grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError

    def forward(self, patches: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
        matrix = self.matrix(weight).astype(np.float32)
        if self.groups == 1:  # one BLAS product
            return patches[:, 0, :] @ matrix[0].T + bias
        out = np.matmul(patches.transpose(1, 0, 2), matrix.transpose(0, 2, 1))  # [g, R, O/g]
        return out.transpose(1, 0, 2).reshape(len(patches), -1) + bias

    def weight_grad(self, patches: np.ndarray, grad_out: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        grad = grad_out.reshape(len(patches), self.groups, -1).astype(np.float32)
        if self.groups == 1:
            return self.unmatrix((grad[:, 0, :].T @ patches[:, 0, :])[None], shape)
        product = np.matmul(grad.transpose(1, 2, 0), patches.transpose(1, 0, 2))  # [g, O/g, K]
        return self.unmatrix(product, shape)


class ConvOp(LayerOp):
    """A 1-D or 2-D Conv (any group count, stride, dilation, explicit padding)."""

    def __init__(self, x: np.ndarray, target: np.ndarray, relu: bool, attrs: dict, kernel: tuple[int, ...]) -> None:
        flat = len(kernel) == 1
        if flat:  # [N, C, L] as [N, C, 1, L]
            x, target, kernel = x[:, :, None, :], target[:, :, None, :], (1, kernel[0])
        pads = list(attrs.get("pads", [0] * 2 * (1 if flat else 2)))
        if flat:
            pads = [0, pads[0], 0, pads[1]]
        x = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
        super().__init__(x, target, relu)
        self.flat = flat
        self.groups = int(attrs.get("group", 1))
        strides = list(attrs.get("strides", [1] * (1 if flat else 2)))
        dilations = list(attrs.get("dilations", [1] * (1 if flat else 2)))
        self.strides = (1, strides[0]) if flat else tuple(strides)
        self.dilations = (1, dilations[0]) if flat else tuple(dilations)
        self.kernel = kernel
        self.pool, self.pool_target = self._pool(np.random.default_rng(0))

    def _pool(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """im2col rows of every output position, or of a random subset that fits ``POOL_BYTES``."""
        n, _, oh, ow = self.target.shape
        k = self.x.shape[1] * self.kernel[0] * self.kernel[1]
        total = n * oh * ow
        keep = min(total, max(ROWS_PER_STEP, POOL_BYTES // (4 * k)))
        index = np.arange(total) if keep == total else np.sort(rng.choice(total, keep, replace=False))
        parts = [self._gather(index[i : i + 4096]) for i in range(0, len(index), 4096)]
        return np.concatenate([p for p, _ in parts]), np.concatenate([t for _, t in parts])

    def sample(self, rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
        count = len(self.pool)
        index = np.arange(count) if count <= rows else rng.integers(0, count, size=rows)
        return self.pool[index], self.pool_target[index]

    def _gather(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        _, _, oh, ow = self.target.shape
        b, rest = np.divmod(index, oh * ow)
        i, j = np.divmod(rest, ow)
        kh, kw = self.kernel
        hh = i[:, None] * self.strides[0] + np.arange(kh) * self.dilations[0]
        ww = j[:, None] * self.strides[1] + np.arange(kw) * self.dilations[1]
        channels = np.arange(self.x.shape[1])
        patches = self.x[
            b[:, None, None, None], channels[None, :, None, None], hh[:, None, :, None], ww[:, None, None, :]
        ]
        targets = self.target[b, :, i, j]
        return patches.reshape(len(index), self.groups, -1), targets

    def matrix(self, weight: np.ndarray) -> np.ndarray:
        return weight.reshape(self.groups, weight.shape[0] // self.groups, -1)

    def unmatrix(self, grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return grad.reshape(shape)


class DenseOp(LayerOp):
    """Gemm (``transB`` either way) or MatMul: rows of the input's last axis."""

    def __init__(self, x: np.ndarray, target: np.ndarray, relu: bool, transposed: bool) -> None:
        super().__init__(x.reshape(-1, x.shape[-1]), target.reshape(-1, target.shape[-1]), relu)
        self.transposed = transposed  # weight stored [O, K] (Gemm transB=1), else [K, O]

    def sample(self, rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
        count = len(self.x)
        index = np.arange(count) if count <= rows else rng.integers(0, count, size=rows)
        return self.x[index][:, None, :], self.target[index]

    def matrix(self, weight: np.ndarray) -> np.ndarray:
        return (weight if self.transposed else weight.T)[None]

    def unmatrix(self, grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return grad[0] if self.transposed else grad[0].T


@dataclass
class Quantizer:
    """The layer's fixed integer grid: ``w = scale * (q - zero_point)``, ``q`` in ``[qmin, qmax]``."""

    scale: np.ndarray
    zero_point: np.ndarray
    qmin: int
    qmax: int


class _Adam:
    def __init__(self, lr: float) -> None:
        self.lr, self.t, self.m, self.v = lr, 0, 0.0, 0.0

    def step(self, value: np.ndarray, grad: np.ndarray) -> np.ndarray:
        self.t += 1
        self.m = 0.9 * self.m + 0.1 * grad
        self.v = 0.999 * self.v + 0.001 * grad * grad
        m_hat = self.m / (1 - 0.9**self.t)
        v_hat = self.v / (1 - 0.999**self.t)
        return value - self.lr * m_hat / (np.sqrt(v_hat) + 1e-8)


def _output_grad(op: LayerOp, out: np.ndarray, target: np.ndarray, norm: float) -> tuple[float, np.ndarray]:
    """Normalised squared error (1.0 = as large as the target) and its gradient w.r.t. the pre-ReLU output."""
    if op.relu:
        live = out > 0
        out = np.where(live, out, 0.0)
    diff = out - target
    grad = 2.0 * diff / (diff.size * norm)
    if op.relu:
        grad = grad * live
    return float(np.mean(diff * diff) / norm), grad


def _norm(op: LayerOp) -> float:
    target = np.maximum(op.target, 0) if op.relu else op.target
    return float(np.mean(np.square(target, dtype=np.float64))) or 1.0


def adaround(
    op: LayerOp, weight: np.ndarray, bias: np.ndarray, grid: Quantizer, iterations: int, lr: float, seed: int = 0
) -> np.ndarray:
    """The integer weights AdaRound chooses (each the float weight rounded down or up)."""
    rng = np.random.default_rng(seed)
    scaled = weight.astype(np.float64) / grid.scale
    floor = np.floor(scaled)
    rest = np.clip(scaled - floor, 0.01, 0.99)
    v = -np.log((ZETA - GAMMA) / (rest - GAMMA) - 1.0)  # h(v) = rest: starts at the float weight
    adam = _Adam(lr)
    norm = _norm(op)
    warm = int(WARMUP * iterations)
    for step in range(iterations):
        sig = 1.0 / (1.0 + np.exp(-v))
        raw = sig * (ZETA - GAMMA) + GAMMA
        h = np.clip(raw, 0.0, 1.0)
        q = floor + h + grid.zero_point
        inside = (q >= grid.qmin) & (q <= grid.qmax)
        w = (np.clip(q, grid.qmin, grid.qmax) - grid.zero_point) * grid.scale
        patches, target = op.sample(rng, ROWS_PER_STEP)
        out = op.forward(patches, w.astype(np.float32), bias)
        _, grad_out = _output_grad(op, out, target, norm)
        grad_h = op.weight_grad(patches, grad_out.astype(np.float32), weight.shape) * grid.scale * inside
        if step >= warm:
            rel = (step - warm) / max(iterations - warm, 1)
            beta = BETA[1] + 0.5 * (BETA[0] - BETA[1]) * (1 + math.cos(math.pi * rel))
            centred = 2.0 * h - 1.0
            grad_h = grad_h - REG_WEIGHT * beta * np.abs(centred) ** (beta - 1) * np.sign(centred) * 2.0 / h.size
        grad_v = grad_h * (ZETA - GAMMA) * sig * (1.0 - sig) * ((raw > 0) & (raw < 1))
        v = adam.step(v, grad_v)
    return np.clip(floor + (v >= 0) + grid.zero_point, grid.qmin, grid.qmax).astype(np.int64)


def adaquant(
    op: LayerOp,
    weight: np.ndarray,
    bias: np.ndarray,
    grid: Quantizer,
    iterations: int,
    lr: float,
    seed: int = 0,
    train_bias: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """(integer weights, float bias) trained through the rounding (straight-through gradient)."""
    rng = np.random.default_rng(seed)
    u = weight.astype(np.float64) / grid.scale  # the weight in quantization steps
    b = bias.astype(np.float64)
    adam_u, adam_b = _Adam(lr), _Adam(lr * float(np.sqrt(_norm(op))))
    norm = _norm(op)
    for _ in range(iterations):
        q = np.round(u) + grid.zero_point
        inside = (q >= grid.qmin) & (q <= grid.qmax)
        w = (np.clip(q, grid.qmin, grid.qmax) - grid.zero_point) * grid.scale
        patches, target = op.sample(rng, ROWS_PER_STEP)
        out = op.forward(patches, w.astype(np.float32), b.astype(np.float32))
        _, grad_out = _output_grad(op, out, target, norm)
        grad_u = op.weight_grad(patches, grad_out.astype(np.float32), weight.shape) * grid.scale * inside
        u = adam_u.step(u, grad_u)
        if train_bias:
            b = adam_b.step(b, grad_out.sum(axis=0))
    ints = np.clip(np.round(u) + grid.zero_point, grid.qmin, grid.qmax).astype(np.int64)
    return ints, b.astype(np.float32)


def layer_error(op: LayerOp, weight: np.ndarray, bias: np.ndarray, rows: int = 8 * ROWS_PER_STEP) -> float:
    """The normalised squared error of ``weight`` on a fixed sample (to keep a fit only if it helps)."""
    patches, target = op.sample(np.random.default_rng(12345), rows)
    out = op.forward(patches, weight.astype(np.float32), bias)
    return _output_grad(op, out, target, _norm(op))[0]
