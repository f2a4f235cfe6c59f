"""The statistics a sensitivity measurement accumulates, and the report it gives. Errors are relative per channel, so a
scale that crushes a tensor's small channels is seen; sums run over slices, so temporaries stay small."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from quantune.evaluate.sensitivity.cost import ancestors, has_subgraphs

_CAP = 1.0
_CHUNK = 1 << 22  # elements per float64 temporary (32 MB)


def _cube(array: np.ndarray) -> tuple[np.ndarray, int]:
    """``array`` as (samples, A, B) and the axis holding its channels: 1 for 4-D and more, else the last."""
    if array.ndim >= 4:
        return array.reshape(array.shape[0], array.shape[1], -1), 1
    if array.ndim == 3:
        return array, 2
    return array.reshape(array.shape[0], 1, array.shape[1]), 2


@dataclass
class NodeStats:
    """Streaming sums for one compared pair of tensors (per channel and overall)."""

    err: np.ndarray | None = None  # per channel sum of squared error
    energy: np.ndarray | None = None  # per channel sum of squared reference
    dot: float = 0.0
    q2: float = 0.0
    count: int = 0
    sample_ratios: list[np.ndarray] = field(default_factory=list)  # per sample: squared error / energy

    def add(self, value: np.ndarray, reference: np.ndarray) -> None:
        value, reference = np.asarray(value), np.asarray(reference)
        if value.shape != reference.shape:
            return
        if reference.ndim <= 1:
            self._add_small(value, reference)
            return
        v_cube, axis = _cube(value)
        r_cube, _ = _cube(reference)
        n, a, b = r_cube.shape
        channels = a if axis == 1 else b
        err, energy = np.zeros(channels), np.zeros(channels)
        row_err, row_energy = np.zeros(n), np.zeros(n)
        step_a = max(1, min(a, _CHUNK // max(b, 1)))
        step_n = max(1, _CHUNK // max(step_a * b, 1))
        # elementwise in float32, sums in float64: much faster, the same figures to 1e-8
        f64 = np.float64
        for n0 in range(0, n, step_n):
            for a0 in range(0, a, step_a):
                v = np.asarray(v_cube[n0 : n0 + step_n, a0 : a0 + step_a], dtype=np.float32)
                r = np.asarray(r_cube[n0 : n0 + step_n, a0 : a0 + step_a], dtype=np.float32)
                d2 = v - r
                np.multiply(d2, d2, out=d2)
                r2 = r * r
                if axis == 1:
                    err[a0 : a0 + step_a] += d2.sum(axis=(0, 2), dtype=f64)
                    energy[a0 : a0 + step_a] += r2.sum(axis=(0, 2), dtype=f64)
                else:
                    err += d2.sum(axis=(0, 1), dtype=f64)
                    energy += r2.sum(axis=(0, 1), dtype=f64)
                rows_err, rows_energy = d2.sum(axis=(1, 2), dtype=f64), r2.sum(axis=(1, 2), dtype=f64)
                row_err[n0 : n0 + step_n] += rows_err
                row_energy[n0 : n0 + step_n] += rows_energy
                q2 = float((v * v).sum(dtype=f64))
                self.q2 += q2
                self.dot += 0.5 * (q2 + float(rows_energy.sum()) - float(rows_err.sum()))  # v.r from the squares
                del v, r, d2, r2
        self._fold(err, energy, value.size, row_err if n > 0 else None, row_energy)

    def _add_small(self, value: np.ndarray, reference: np.ndarray) -> None:
        """Scalars and vectors: every element is its own channel (and, for a vector, its own sample)."""
        vector = reference.ndim == 1 and reference.shape[0] > 0
        v = value.astype(np.float64).reshape(1, -1)
        r = reference.astype(np.float64).reshape(1, -1)
        d2, r2 = np.square(v - r), np.square(r)
        self.dot += float(np.sum(v * r))
        self.q2 += float(np.sum(v * v))
        self._fold(d2.sum(axis=0), r2.sum(axis=0), value.size, d2[0] if vector else None, r2[0])

    def _fold(self, err, energy, size: int, row_err, row_energy) -> None:
        self.err = err if self.err is None else self.err + err
        self.energy = energy if self.energy is None else self.energy + energy
        self.count += size
        if row_err is not None:
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                ratio = np.where(row_energy > 0, row_err / np.where(row_energy > 0, row_energy, 1.0), 0.0)
            self.sample_ratios.append(np.where(np.isfinite(ratio), np.minimum(ratio, _CAP), _CAP))

    def nmse(self) -> float:
        """The larger of the typical channel's error and the mean sample's (per channel, small samples vanish)."""
        samples = float(np.mean(np.concatenate(self.sample_ratios))) if self.sample_ratios else 0.0
        return max(self.channel_nmse(), samples)

    def channel_nmse(self) -> float:
        """Median over live channels of squared error / energy (capped at 1): the typical channel."""
        if self.err is None or self.energy is None:
            return 0.0
        # A non-finite error or reference is the worst there is: capped, never a NaN that sorts anywhere.
        bad = ~np.isfinite(self.err) | ~np.isfinite(self.energy)
        finite = self.energy[~bad]
        top = float(finite.max()) if finite.size else 0.0
        live = bad | (self.energy > 1e-12 * max(top, 1e-30))
        if not live.any():
            return 0.0
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            ratio = self.err[live] / self.energy[live]
        ratio = np.where(np.isfinite(ratio) & ~bad[live], ratio, _CAP)
        return float(np.median(np.minimum(ratio, _CAP)))

    def summary(self) -> dict[str, float]:
        if self.err is None or self.energy is None or self.count == 0:
            return {}
        err, energy = float(self.err.sum()), float(self.energy.sum())
        sqnr = 10 * np.log10(energy / err) if err > 0 else float("inf")
        cosine = self.dot / np.sqrt(max(self.q2 * energy, 1e-300))
        return {"mse": err / self.count, "sqnr_db": float(min(sqnr, 300.0)), "cosine": float(cosine)}


@dataclass
class SensitivityReport:
    """Scores per node of the float model (higher = more harm from quantizing it)."""

    scores: dict[str, float]
    weight_noise: dict[str, float] = field(default_factory=dict)
    activation_noise: dict[str, float] = field(default_factory=dict)
    tensors: dict[str, dict[str, float]] = field(default_factory=dict)  # vs the float model
    outputs: dict[str, dict[str, float]] = field(default_factory=dict)
    rows: int = 0
    product_noise: dict[str, float] = field(default_factory=dict)  # MatMuls of two activations
    head: dict[str, float] = field(default_factory=dict)  # head / amplified nodes: loss at the outputs (head.py)

    def to_json(self) -> dict[str, Any]:
        return {
            "product_noise": self.product_noise,
            "scores": self.scores,
            "weight_noise": self.weight_noise,
            "activation_noise": self.activation_noise,
            "tensors": self.tensors,
            "outputs": self.outputs,
            "rows": self.rows,
            "head": self.head,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SensitivityReport:
        return cls(
            dict(data["scores"]),
            dict(data["weight_noise"]),
            dict(data["activation_noise"]),
            dict(data["tensors"]),
            dict(data["outputs"]),
            int(data["rows"]),
            dict(data.get("product_noise", {})),
            dict(data.get("head", {})),
        )


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    """A CPU session that shows every tensor as the graph defines it, and keeps no arena."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    # No fusions: every tensor keeps the value the QDQ graph defines.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # No memory arena (it keeps the largest batch's blocks and grows with fragmentation), so the peak is one batch's.
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    # Idle threads sleep: a capture group holds a session per weighted node, and spinning pools took the cores from the
    # one that runs.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def with_outputs(model: onnx.ModelProto, names: Sequence[str], *, only: bool = False) -> onnx.ModelProto:
    """A copy of ``model`` that also outputs ``names``; with ``only``, just them and the nodes they depend on."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if only:
        del copy.graph.output[:]
        _keep_ancestors(copy.graph, set(names))
    present = {out.name for out in copy.graph.output}
    for name in names:
        if name not in present:
            copy.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
    return copy


def _keep_ancestors(graph: onnx.GraphProto, wanted: set[str]) -> None:
    """Drops the nodes ``wanted`` does not depend on (a graph with subgraphs is left whole)."""
    if has_subgraphs(graph):
        return
    kept = ancestors(graph, wanted)
    needed = set(wanted) | {name for node in kept for name in node.input if name}
    inits = [init for init in graph.initializer if init.name in needed]
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend(inits)


def single_node(node: onnx.NodeProto, model: onnx.ModelProto, activations: Sequence[str]) -> onnx.ModelProto:
    """A model of ``node`` alone: its activation inputs are graph inputs, the rest initializers."""
    inits = {init.name: init for init in model.graph.initializer}
    graph = helper.make_graph(
        [node],
        "single",
        [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in activations],
        [onnx.ValueInfoProto(name=out) for out in node.output if out],
        [inits[name] for name in node.input if name in inits],
    )
    single = helper.make_model(graph, opset_imports=model.opset_import)
    single.ir_version = model.ir_version
    return single
