"""What ``quantune init`` reads from a model: its inputs and outputs, and what kind of model it is.

A starter config only helps when it matches the model: input names, types and shared free
dimensions, and the op mix, which decides what is worth searching.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from quantune.errors import QuantuneError

CONV_OPS = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv"}
MATMUL_OPS = {"MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "FusedMatMul"}
RECURRENT_OPS = {"LSTM", "GRU", "RNN", "DynamicQuantizeLSTM"}
ATTENTION_OPS = {"Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention"}


@dataclass(frozen=True)
class TensorInfo:
    """One graph input or output: ``dims`` entries are an int (fixed), a str (a named free
    dimension, shared by every tensor that names it) or None (free and unnamed)."""

    name: str
    dtype: str  # numpy's name: float32, int64, ...
    dims: tuple[int | str | None, ...] | None  # None: rank unknown
    vocabulary: int | None = None  # an integer input that indexes a table (Gather): the table's rows

    @property
    def batch_fixed(self) -> int | None:
        return self.dims[0] if self.dims and isinstance(self.dims[0], int) else None

    def describe(self) -> str:
        dims = "?" if self.dims is None else "[" + ", ".join("?" if d is None else str(d) for d in self.dims) + "]"
        return f"{self.name}: {self.dtype} {dims}"


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    opset: int
    op_counts: dict[str, int] = field(default_factory=dict)

    @property
    def kinds(self) -> list[str]:
        """What the compute is: any of conv-heavy, MatMul-heavy, recurrent, attention (or "other")."""
        conv = sum(self.op_counts.get(op, 0) for op in CONV_OPS)
        matmul = sum(self.op_counts.get(op, 0) for op in MATMUL_OPS)
        kinds = []
        if conv and conv >= matmul:
            kinds.append("conv-heavy")
        if matmul and matmul > conv:
            kinds.append("MatMul-heavy")
        if any(self.op_counts.get(op) for op in RECURRENT_OPS):
            kinds.append("recurrent")
        if self.has_attention:
            kinds.append("attention")
        return kinds or ["other"]

    @property
    def has_attention(self) -> bool:
        return any(self.op_counts.get(op) for op in ATTENTION_OPS) or self.op_counts.get("_softmax_after_matmul", 0) > 0

    @property
    def image_like(self) -> bool:
        """One float input of rank 4 with 1 or 3 channels (NCHW or NHWC): a folder of images fits it."""
        if len(self.inputs) != 1:
            return False
        spec = self.inputs[0]
        return (
            spec.dtype.startswith("float")
            and spec.dims is not None
            and len(spec.dims) == 4
            and (spec.dims[1] in (1, 3) or spec.dims[3] in (1, 3))
        )

    def compute_summary(self) -> str:
        """E.g. "53 Conv, 2 MatMul/Gemm, 0 recurrent (conv-heavy)"."""
        conv = sum(self.op_counts.get(op, 0) for op in CONV_OPS)
        matmul = sum(self.op_counts.get(op, 0) for op in MATMUL_OPS)
        recurrent = sum(self.op_counts.get(op, 0) for op in RECURRENT_OPS)
        parts = [f"{conv} Conv", f"{matmul} MatMul/Gemm", f"{recurrent} LSTM/GRU/RNN"]
        nodes = sum(n for op, n in self.op_counts.items() if not op.startswith("_"))
        return f"{nodes} nodes: {', '.join(parts)}; {', '.join(self.kinds)}"


def read_model(path: Path) -> ModelInfo:
    """Reads the model's declared inputs (initializers excluded), outputs and op mix."""
    if not path.is_file():
        raise QuantuneError(f"init: no model at '{path}'")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise QuantuneError(f"init: '{path}' is not a readable ONNX model ({type(exc).__name__}: {exc})") from None
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    constants = {out: node for node in graph.node if node.op_type == "Constant" for out in node.output}
    counts = Counter(node.op_type for node in graph.node)
    producers = {out: node for node in graph.node for out in node.output}
    counts["_softmax_after_matmul"] = sum(
        1
        for node in graph.node
        if node.op_type == "Softmax" and _fed_by_matmul(node, producers, set(initializers) | set(constants))
    )
    vocab = _vocabularies(graph, initializers)
    inputs = [_tensor(v, vocab.get(v.name)) for v in graph.input if v.name not in initializers]
    outputs = [_tensor(v, None) for v in graph.output]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return ModelInfo(path, inputs, outputs, opset, dict(counts))


def _fed_by_matmul(
    node: onnx.NodeProto, producers: dict[str, onnx.NodeProto], weights: set[str], depth: int = 4
) -> bool:
    """Whether a MatMul of two activations (query x key, not a layer with weights) feeds ``node``
    through at most ``depth`` elementwise steps (scale, mask): the mark of attention."""
    frontier = list(node.input[:1])
    for _ in range(depth):
        nxt = []
        for name in frontier:
            producer = producers.get(name)
            if producer is None:
                continue
            if producer.op_type in MATMUL_OPS and not any(name in weights for name in producer.input[:2]):
                return True
            if producer.op_type in {"Add", "Div", "Mul", "Where", "Cast", "Sub"}:
                nxt.extend(producer.input)
        frontier = nxt
    return False


def _vocabularies(graph: onnx.GraphProto, initializers: dict) -> dict[str, int]:
    """Integer graph inputs used as Gather indices into a weight table: input -> the table's rows."""
    found: dict[str, int] = {}
    for node in graph.node:
        if node.op_type != "Gather" or len(node.input) < 2:
            continue
        table = initializers.get(node.input[0])
        if table is not None and table.dims:
            found[node.input[1]] = min(found.get(node.input[1], table.dims[0]), int(table.dims[0]))
    return found


def _tensor(value: onnx.ValueInfoProto, vocabulary: int | None) -> TensorInfo:
    tensor = value.type.tensor_type if value.type.HasField("tensor_type") else None
    dtype = "unknown"
    dims: tuple[int | str | None, ...] | None = None
    if tensor is not None:
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name
        except Exception:
            dtype = "unknown"
        if tensor.HasField("shape"):
            dims = tuple(_dim(d) for d in tensor.shape.dim)
    return TensorInfo(value.name, dtype, dims, vocabulary)


def _dim(dim: onnx.TensorShapeProto.Dimension) -> int | str | None:
    if dim.HasField("dim_value") and dim.dim_value > 0:
        return int(dim.dim_value)
    if dim.HasField("dim_param") and dim.dim_param and dim.dim_param != "?":
        return dim.dim_param
    return None
