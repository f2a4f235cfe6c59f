"""Per-operator quantization sensitivity from one pass of calibration data, not one evaluation per op.

Neural Compressor's basic strategy learns which operators to keep in fp32 by evaluating the
model once per operator. Here one run of a slice of calibration data through the QDQ model
(and the float model it came from) scores every node at once:

* **activation noise** of each quantized tensor ``T``: the Q/DQ pair's own error,
  ``DQ(Q(T))`` against ``T`` *inside the quantized model*, so the error already carried in
  from upstream is not counted again (a late node is not blamed for an early one's noise);
* **weight noise** of each Conv/MatMul/Gemm: the node is re-run alone on the activations it
  really sees, once with its float weights and once with the dequantized ones, so a weight
  error is measured where it matters (a tiny weight rounded to zero that multiplies a huge
  activation shows up, although it is small as a weight);
* **product noise** of each MatMul of two activations (attention's ``Softmax -> MatMul`` and
  ``Q @ K^T``): the node is re-run alone on its inputs before and after their Q/DQ pairs, so
  the error the activations' rounding causes *through the product* is seen (softmax
  probabilities rounded to 1/255 look harmless as a tensor, not once they weight the values).

Errors are relative per channel (each channel's squared error over its energy, averaged over
channels, each capped at 1): a per-tensor scale that crushes the small channels of a tensor
whose few large channels dominate its energy is seen, although the tensor-wide MSE is small.
A node's score is its weight (or product) noise plus the noise of the activation tensors it
reads or writes; a group's is the sum over its nodes. For the report, every tensor is also compared
with the float model (MSE, SQNR, cosine), and so are the final outputs.

Results are cached in the artifact cache under (float model hash, quantized model hash,
data fingerprint, rows): the quantized model's hash covers the whole quantization config.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from quantune.data import Dataset
from quantune.memory import memory_budget_mb, note_stage_peak, peak_tracker
from quantune.passes import PassConfig
from quantune.passes.cached import run_pass_cached
from quantune.store import ArtifactCache, cache_key

log = logging.getLogger("quantune.sensitivity")

VERSION = 4  # 4: per-sample error counts too (_Stats.nmse)
_CAP = 1.0
_WEIGHTED = {"Conv", "ConvTranspose", "MatMul", "Gemm"}


@dataclass
class _Stats:
    """Streaming sums for one compared pair of tensors (per channel and overall)."""

    err: np.ndarray | None = None  # per channel sum of squared error
    energy: np.ndarray | None = None  # per channel sum of squared reference
    dot: float = 0.0
    q2: float = 0.0
    count: int = 0
    sample_ratios: list[np.ndarray] = field(default_factory=list)  # per sample: squared error / energy

    def add(self, value: np.ndarray, reference: np.ndarray) -> None:
        value = np.asarray(value, dtype=np.float64)
        reference = np.asarray(reference, dtype=np.float64)
        if value.shape != reference.shape:
            return
        channels = _channels(reference)
        diff = _channels(value) - channels
        err = np.square(diff).sum(axis=0)
        energy = np.square(channels).sum(axis=0)
        self.err = err if self.err is None else self.err + err
        self.energy = energy if self.energy is None else self.energy + energy
        self.dot += float(np.sum(value * reference))
        self.q2 += float(np.sum(value * value))
        self.count += value.size
        if reference.ndim >= 1 and reference.shape[0] > 0:
            rows = reference.reshape(reference.shape[0], -1)
            row_err = np.square(value.reshape(rows.shape) - rows).sum(axis=1)
            row_energy = np.square(rows).sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                ratio = np.where(row_energy > 0, row_err / np.where(row_energy > 0, row_energy, 1.0), 0.0)
            self.sample_ratios.append(np.where(np.isfinite(ratio), np.minimum(ratio, _CAP), _CAP))

    def nmse(self) -> float:
        """The larger of the typical channel's error (:meth:`channel_nmse`) and the mean sample's.

        Per channel, the error is summed over samples, so samples of a small scale vanish
        under the large ones: a LayerNorm's ``variance + eps`` of shape [N, 1] over rows whose
        scales differ 1000x loses every small row to one quantization step, and per channel
        that looked like no error at all (measured: score 0 for the op that alone took top-1
        from 0.99 to 0.60). Per sample, each row's own error over its own energy counts.
        """
        samples = float(np.mean(np.concatenate(self.sample_ratios))) if self.sample_ratios else 0.0
        return max(self.channel_nmse(), samples)

    def channel_nmse(self) -> float:
        """Median over live channels of squared error / energy (capped at 1): the typical channel."""
        if self.err is None or self.energy is None:
            return 0.0
        # A non-finite error or reference (a tensor that holds inf, like an attention mask of
        # -inf, quantized with an infinite scale) is the worst there is: capped, never a NaN
        # that sorts anywhere.
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


def _channels(array: np.ndarray) -> np.ndarray:
    """(rows, channels): NCHW-like tensors by axis 1, others by their last axis."""
    if array.ndim == 0:
        return array.reshape(1, 1)
    if array.ndim >= 4:
        moved = np.moveaxis(array, 1, -1)
        return moved.reshape(-1, moved.shape[-1])
    return array.reshape(-1, array.shape[-1])


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

    def to_json(self) -> dict[str, Any]:
        return {
            "product_noise": self.product_noise,
            "scores": self.scores,
            "weight_noise": self.weight_noise,
            "activation_noise": self.activation_noise,
            "tensors": self.tensors,
            "outputs": self.outputs,
            "rows": self.rows,
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
        )


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    # No fusions: every tensor keeps the value the QDQ graph defines.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # No memory arena: the arena keeps the largest batch's blocks and grows with fragmentation
    # over many runs; freed tensors go back to the allocator, so the peak is one batch's.
    options.enable_cpu_mem_arena = False
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _with_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    present = {out.name for out in copy.graph.output}
    for name in names:
        if name not in present:
            copy.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
    return copy


def _single_node(node: onnx.NodeProto, model: onnx.ModelProto, activations: Sequence[str]) -> onnx.ModelProto:
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


def _within_budget(
    batches: Iterable[dict[str, np.ndarray]],
    q_session: ort.InferenceSession,
    f_session: ort.InferenceSession,
    input_names: set[str],
    budget_mb: float | None,
) -> Iterator[dict[str, np.ndarray]]:
    """``batches``, each cut along its first axis into pieces whose captured tensors fit the budget.

    One batch's every intermediate tensor of both models is held at once (the statistics
    then accumulate per tensor), so a batch of a dozen 960x736 pages is several GB: the
    bytes for one row are measured on the first batch and larger batches are cut (when the
    model's batch dimension is free; a fixed one is left as it is).
    """
    iterator = iter(batches)
    first = next(iterator, None)
    if first is None:
        return
    max_rows = None
    free = all(arg.shape and not isinstance(arg.shape[0], int) for arg in f_session.get_inputs())
    rows = len(next(iter(first.values())))
    if free and rows > 1:
        one = {k: v[:1] for k, v in first.items() if k in input_names}
        per_row = sum(np.asarray(o).nbytes for o in q_session.run(None, one))
        per_row += sum(np.asarray(o).nbytes for o in f_session.run(None, one))
        budget = memory_budget_mb() if budget_mb is None else budget_mb
        max_rows = max(1, int(budget * 1024 * 1024 / 2 // max(per_row, 1)))
    for batch in itertools.chain([first], iterator):
        n = len(next(iter(batch.values())))
        if max_rows is None or n <= max_rows:
            yield batch
            continue
        for start in range(0, n, max_rows):
            yield {k: v[start : start + max_rows] for k, v in batch.items()}


def measure(
    float_model: str | Path,
    quant_model: str | Path,
    batches: Iterable[dict[str, np.ndarray]],
    *,
    budget_mb: float | None = None,
) -> SensitivityReport:
    """Scores every node of ``float_model`` against its QDQ quantization ``quant_model``.

    Streaming: per batch, each compared tensor's statistics are accumulated and the batch's
    tensors dropped; batches are cut to fit ``budget_mb`` (default: :func:`memory_budget_mb`).
    """
    fmodel = onnx.load(str(float_model))
    qmodel = onnx.load(str(quant_model))
    f_inits = {init.name for init in fmodel.graph.initializer}
    q_inits = {init.name for init in qmodel.graph.initializer}
    f_tensors = {out for node in fmodel.graph.node for out in node.output} | {i.name for i in fmodel.graph.input}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in qmodel.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    # Quantized activation tensors: raw float T -> its DQ(Q(T)), named by the float model's tensor.
    qdq: dict[str, tuple[str, str]] = {}  # float name -> (raw in quant model, dequantized in quant model)
    for node in qmodel.graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] in q_inits:
            continue
        for dq in consumers.get(node.output[0], []):
            if dq.op_type == "DequantizeLinear":
                raw, seen = node.input[0], dq.output[0]
                name = raw if raw in f_tensors else seen
                if name in f_tensors:
                    qdq[name] = (raw, seen)
                break

    # Weighted nodes: (float node, the activations it sees in the quant model, its dequantized weights).
    q_by_name = {node.name: node for node in qmodel.graph.node}
    weighted: list[tuple[onnx.NodeProto, list[tuple[str, str]], list[tuple[str, str]]]] = []
    for node in fmodel.graph.node:
        qnode = q_by_name.get(node.name)
        if node.op_type not in _WEIGHTED or qnode is None or len(qnode.input) != len(node.input):
            continue
        acts = [(f, q) for f, q in zip(node.input, qnode.input, strict=True) if f and f not in f_inits]
        weights = [
            (f, q) for f, q in zip(node.input, qnode.input, strict=True) if f in f_inits and q not in q_inits and q != f
        ]
        if acts and weights:
            weighted.append((node, acts, weights))

    # MatMuls of two quantized activations: (float node, [(float input, raw, dequantized)]).
    raw_of = {seen: raw for raw, seen in qdq.values()}
    products: list[tuple[onnx.NodeProto, list[tuple[str, str, str]]]] = []
    for node in fmodel.graph.node:
        qnode = q_by_name.get(node.name)
        if node.op_type != "MatMul" or qnode is None or len(qnode.input) != len(node.input):
            continue
        if any(f in f_inits for f in node.input):
            continue
        pairs = [(f, raw_of.get(q, q), q) for f, q in zip(node.input, qnode.input, strict=True)]
        if any(seen in raw_of for _, _, seen in pairs):
            products.append((node, pairs))

    q_capture = sorted(
        {name for pair in qdq.values() for name in pair}
        | {q for _, acts, weights in weighted for _, q in [*acts, *weights]}
        | {name for _, pairs in products for _, raw, seen in pairs for name in (raw, seen)}
    )
    f_capture = sorted(qdq) + [out.name for out in fmodel.graph.output]
    q_session = _session(_with_outputs(qmodel, q_capture + [o.name for o in qmodel.graph.output]))
    f_session = _session(_with_outputs(fmodel, f_capture))
    singles = {node.name: _session(_single_node(node, fmodel, [f for f, _ in acts])) for node, acts, _ in weighted}
    singles.update({node.name: _session(_single_node(node, fmodel, list(node.input))) for node, _ in products})
    q_out_names = [o.name for o in q_session.get_outputs()]
    f_out_names = [o.name for o in f_session.get_outputs()]
    f_input_names = {i.name for i in f_session.get_inputs()}

    act_stats = {name: _Stats() for name in qdq}
    ref_stats = {name: _Stats() for name in qdq}
    weight_stats = {node.name: _Stats() for node, _, _ in weighted}
    out_stats = {o.name: _Stats() for o in fmodel.graph.output}
    product_stats = {node.name: _Stats() for node, _ in products}
    swapped: dict[str, ort.InferenceSession] = {}
    rows = 0
    for batch in _within_budget(batches, q_session, f_session, f_input_names, budget_mb):
        feeds = {k: v for k, v in batch.items() if k in f_input_names}
        rows += len(next(iter(feeds.values())))
        qv = dict(zip(q_out_names, q_session.run(q_out_names, feeds), strict=True))
        fv = dict(zip(f_out_names, f_session.run(f_out_names, feeds), strict=True))
        for name, (raw, seen) in qdq.items():
            act_stats[name].add(qv[seen], qv[raw])
            ref_stats[name].add(qv[seen], fv[name])
        for out in out_stats:
            if out in qv and out in fv:
                out_stats[out].add(qv[out], fv[out])
        for node, acts, weights in weighted:
            single = singles[node.name]
            act_feeds = {f: qv[q] for f, q in acts}
            reference = single.run(None, act_feeds)[0]
            # The same node with dequantized weights: swap the initializers for what DQ produced.
            if node.name not in swapped:  # dequantized weights are constants: build once
                swapped[node.name] = _swap_weights(node, fmodel, {f: qv[q] for f, q in weights})
            value = swapped[node.name].run(None, act_feeds)[0]
            weight_stats[node.name].add(value, reference)
        for node, pairs in products:
            single = singles[node.name]
            reference = single.run(None, {f: qv[raw] for f, raw, _ in pairs})[0]
            value = single.run(None, {f: qv[seen] for f, _, seen in pairs})[0]
            product_stats[node.name].add(value, reference)
        # dropped before the next batch runs, so two batches' tensors are never held at once
        del qv, fv, feeds, batch
        reference = value = None

    activation_noise = {name: stats.nmse() for name, stats in act_stats.items()}
    weight_noise = {name: stats.nmse() for name, stats in weight_stats.items()}
    product_noise = {name: stats.nmse() for name, stats in product_stats.items()}
    scores: dict[str, float] = {}
    for node in fmodel.graph.node:
        adjacent = [t for t in [*node.input, *node.output] if t in activation_noise]
        scores[node.name] = (
            weight_noise.get(node.name, 0.0)
            + product_noise.get(node.name, 0.0)
            + sum(activation_noise[t] for t in adjacent)
        )
    return SensitivityReport(
        scores=scores,
        weight_noise=weight_noise,
        activation_noise=activation_noise,
        tensors={name: stats.summary() for name, stats in ref_stats.items()},
        outputs={name: stats.summary() for name, stats in out_stats.items()},
        rows=rows,
        product_noise=product_noise,
    )


def _swap_weights(node: onnx.NodeProto, model: onnx.ModelProto, weights: Mapping[str, np.ndarray]):
    """A session of ``node`` alone with ``weights`` in place of its float initializers."""
    activations = [name for name in node.input if name and name not in weights and name not in _inits(model)]
    single = _single_node(node, model, activations)
    kept = [init for init in single.graph.initializer if init.name not in weights]
    del single.graph.initializer[:]
    single.graph.initializer.extend(kept)
    single.graph.initializer.extend(
        numpy_helper.from_array(np.asarray(value, dtype=np.float32), name) for name, value in weights.items()
    )
    return _session(single)


def _inits(model: onnx.ModelProto) -> set[str]:
    return {init.name for init in model.graph.initializer}


# -- dynamic quantization ------------------------------------------------------------------------


def _fake_quant(array: np.ndarray, kind: str, *, reduce_range: bool = False, axis: int | None = None) -> np.ndarray:
    """``array`` quantized and dequantized as onnxruntime does: int8 symmetric, uint8 asymmetric
    (range widened to hold 0, like DynamicQuantizeLinear); per tensor, or per slice along ``axis``."""
    x = np.asarray(array, dtype=np.float32)
    reduce = tuple(i for i in range(x.ndim) if axis is None or i != axis % x.ndim)
    if kind == "int8":
        qmax = 63.0 if reduce_range else 127.0
        scale = np.max(np.abs(x), axis=reduce, keepdims=True) / qmax
        scale = np.where(scale > 0, scale, 1.0)
        return np.clip(np.round(x / scale), -qmax, qmax) * scale
    qmax = 127.0 if reduce_range else 255.0
    low = np.minimum(np.min(x, axis=reduce, keepdims=True), 0.0)
    high = np.maximum(np.max(x, axis=reduce, keepdims=True), 0.0)
    scale = (high - low) / qmax
    scale = np.where(scale > 0, scale, 1.0)
    zero = np.round(-low / scale)
    return (np.clip(np.round(x / scale) + zero, 0, qmax) - zero) * scale


def measure_dynamic(
    float_model: str | Path,
    batches: Iterator[dict[str, np.ndarray]] | Sequence[dict[str, np.ndarray]],
    *,
    weight_type: str = "int8",
    per_channel: bool = False,
    reduce_range: bool = False,
) -> SensitivityReport:
    """Scores the nodes ``quantize_dynamic`` would touch, without building the quantized model.

    Each MatMul with constant weights is re-computed on the activations it sees in the float
    model, once in float and once as the dynamic kernel does it (the activation quantized to
    uint8 per tensor and per batch at run time, the weights to ``weight_type``, per output
    column when ``per_channel``); an embedding Gather is compared with a lookup in its
    quantized table. A node's score is the relative per-channel error of its output, so the
    activation's own noise (outlier channels stretch the per-tensor range) counts where it
    is multiplied, as much as the weights'.
    """
    from quantune.passes.onnx.capability import ModelCapability

    model = onnx.load(str(float_model))
    inits = {init.name: init for init in model.graph.initializer}
    capability = ModelCapability.from_model(model, mode="dynamic")
    nodes = [node for node in model.graph.node if (node.name or "") in capability.quantizable]
    plans: list[tuple[onnx.NodeProto, str, np.ndarray]] = []  # (node, activation input, quantized constant)
    references: dict[str, np.ndarray] = {}
    for node in nodes:
        if node.op_type == "MatMul" and node.input[1] in inits:
            weight = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
            axis = -1 if per_channel and weight.ndim >= 2 else None
            plans.append((node, node.input[0], _fake_quant(weight, weight_type, reduce_range=reduce_range, axis=axis)))
            references[node.name] = weight
        elif node.op_type == "Gather" and node.input[0] in inits:
            table = numpy_helper.to_array(inits[node.input[0]]).astype(np.float32)
            plans.append((node, node.input[1], _fake_quant(table, weight_type, reduce_range=reduce_range)))
            references[node.name] = table
    capture = sorted({act for _, act, _ in plans} - set(inits))
    session = _session(_with_outputs(model, capture))
    out_names = [o.name for o in session.get_outputs()]
    input_names = {i.name for i in session.get_inputs()}
    stats = {node.name: _Stats() for node, _, _ in plans}
    rows = 0
    for batch in batches:
        feeds = {k: v for k, v in batch.items() if k in input_names}
        rows += len(next(iter(feeds.values())))
        values = dict(zip(out_names, session.run(out_names, feeds), strict=True))
        values.update({k: v for k, v in feeds.items() if k in capture and k not in values})
        for node, act, quantized in plans:
            if act not in values:
                continue
            if node.op_type == "MatMul":
                a = np.asarray(values[act], dtype=np.float32)
                reference = a @ references[node.name]
                value = _fake_quant(a, "uint8", reduce_range=False) @ quantized
            else:
                indices = np.asarray(values[act]).astype(np.int64)
                axis = _attr(node, "axis", 0)
                reference = np.take(references[node.name], indices, axis=axis)
                value = np.take(quantized, indices, axis=axis)
            stats[node.name].add(value, reference)
        del values, feeds, batch  # before the next batch runs
        reference = value = None
    scores = {node.name: 0.0 for node in model.graph.node}
    noise = {name: stat.nmse() for name, stat in stats.items()}
    scores.update(noise)
    return SensitivityReport(
        scores=scores,
        weight_noise=noise,
        tensors={name: stat.summary() for name, stat in stats.items()},
        rows=rows,
    )


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for attribute in node.attribute:
        if attribute.name == name:
            return int(attribute.i)
    return default


# -- the probe a strategy calls -----------------------------------------------------------------

StepConfigs = Callable[[Mapping[str, Any], tuple[str, ...]], list[tuple[Any, PassConfig]]]


@dataclass(frozen=True)
class ProbeJob:
    """One sensitivity measurement as plain data, so it can run in a worker process."""

    model_path: Path
    model_sha: str
    steps: list[tuple[str, type, PassConfig]]  # (step id, pass class, config) up to the quant step
    quant_step: str
    calibration: Dataset
    input_names: list[str]
    batch_size: int
    cache_root: Path
    rows: int
    dynamic: bool


def run_probe(job: ProbeJob, cache: ArtifactCache | None = None) -> dict[str, Any]:
    """The :class:`SensitivityReport` of ``job`` as JSON data (through the artifact cache)."""
    cache = cache or ArtifactCache(job.cache_root)
    current, current_sha = job.model_path, job.model_sha

    def run(step_id: str, pass_cls: type, config: PassConfig) -> tuple[Path, str]:
        path, sha, _ = run_pass_cached(
            cache,
            pass_cls,
            config,
            current,
            current_sha,
            calibration=job.calibration,
            input_names=job.input_names,
            batch_size=job.batch_size,
            label=f"{step_id} (sensitivity)",
        )
        return path, sha

    if job.dynamic:
        options: dict[str, Any] = {}
        for step_id, pass_cls, config in job.steps:
            if step_id == job.quant_step:
                dumped = config.model_dump()
                options = {k: dumped[k] for k in ("weight_type", "per_channel", "reduce_range") if k in dumped}
                break
            current, current_sha = run(step_id, pass_cls, config)
        key = cache_key("sensitivity-dynamic", VERSION, current_sha, options, job.calibration.fingerprint, job.rows)
        cached = cache.get_json("sensitivity", key)
        if cached is not None:
            return cached
        batches = job.calibration.batches(job.input_names, job.batch_size, job.rows)
        report = measure_dynamic(current, batches, **options)
    else:
        float_path, float_sha = current, current_sha
        for step_id, pass_cls, config in job.steps:
            if step_id == job.quant_step:
                float_path, float_sha = current, current_sha
                # QDQ: the same numbers as QOperator, but every tensor stays visible
                config = type(config).model_validate({**config.model_dump(), "quant_format": "QDQ"})
            current, current_sha = run(step_id, pass_cls, config)
        key = cache_key("sensitivity", VERSION, float_sha, current_sha, job.calibration.fingerprint, job.rows)
        cached = cache.get_json("sensitivity", key)
        if cached is not None:
            return cached
        batches = job.calibration.batches(job.input_names, job.batch_size, job.rows)
        with peak_tracker() as peak:
            report = measure(float_path, current, batches)
        note_stage_peak("sensitivity_measure", peak.mb)
    data = report.to_json()
    cache.put_json("sensitivity", key, data)
    return data


@dataclass
class SensitivityProbe:
    """``probe(point)`` -> node scores for the flow's static quantization at ``point``.

    Runs the flow's passes up to the static-quant step (through the artifact cache, with the
    engine's keys, so trials reuse them), with the quantization forced to QDQ (same numbers
    as QOperator, but every tensor stays visible), then :func:`measure` on a slice of the
    calibration data. Reports are cached; the last one is kept in ``last``.

    With ``isolation`` (the engine's), all of it runs in a worker process under the trial
    workers' limits: a measurement that dies or runs out of memory is recorded and gives
    no scores (the strategy then ranks in graph order), and no later point is probed.
    """

    model_path: Path
    model_sha: str
    flow: tuple[str, ...]
    quant_step: str
    configs_for: StepConfigs
    calibration: Dataset
    input_names: list[str]
    batch_size: int
    cache: ArtifactCache
    rows: int = 128
    last: SensitivityReport | None = None
    calls: int = 0
    dynamic: bool = False  # the quant step is dynamic_quant: scored by :func:`measure_dynamic`
    isolation: Any = None  # quantune.engine.executors.stage.Isolation, or None: in this process
    failed: str | None = None  # why an isolated measurement failed; no scores after that

    def __call__(self, point: Mapping[str, Any]) -> dict[str, float]:
        return dict(self.report(point).scores)

    def report(self, point: Mapping[str, Any]) -> SensitivityReport:
        self.calls += 1
        if self.failed is not None:
            return SensitivityReport(scores={})
        steps = self.flow[: self.flow.index(self.quant_step) + 1]
        job = ProbeJob(
            model_path=self.model_path,
            model_sha=self.model_sha,
            steps=[(step.id, step.pass_cls, config) for step, config in self.configs_for(point, steps)],
            quant_step=self.quant_step,
            calibration=self.calibration,
            input_names=list(self.input_names),
            batch_size=self.batch_size,
            cache_root=self.cache.root,
            rows=self.rows,
            dynamic=self.dynamic,
        )
        if self.isolation is None:
            data = run_probe(job, self.cache)
        else:
            from quantune.engine.executors.stage import run_stage

            outcome = run_stage("sensitivity", run_probe, job, isolation=self.isolation)
            if not outcome.ok:
                self.failed = outcome.error
                log.warning("sensitivity analysis failed (%s); groups are ranked in graph order", outcome.error)
                self.last = SensitivityReport(scores={})
                return self.last
            data = outcome.value
        self.last = SensitivityReport.from_json(data)
        return self.last
