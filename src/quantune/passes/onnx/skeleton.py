"""A model's skeleton: the model without the bytes of the weights that shape inference never reads.

Shape inference needs a weight's type and dims, not its values, except for inputs some ops read
as data (a Reshape's shape, ...); serializing or copying a large model for it is most of its
time. A skeleton drops ``raw_data`` only of large float weights whose every reader is an (op,
input) pair that inference engine reads no values of, so its inference result is the whole
model's. (``quantune.model.without_weights`` is the looser cousin, for results checked afterwards.)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import onnx
from onnx import TensorProto

from quantune.model import stripped

LARGE = 8192  # bytes: smaller weights stay (copying them costs nothing)
_ITEMSIZE = {
    TensorProto.FLOAT: 4,
    TensorProto.FLOAT16: 2,
    TensorProto.BFLOAT16: 2,
    TensorProto.DOUBLE: 8,
    TensorProto.INT8: 1,
    TensorProto.UINT8: 1,
    TensorProto.INT16: 2,
    TensorProto.UINT16: 2,
    TensorProto.INT32: 4,
    TensorProto.UINT32: 4,
    TensorProto.INT64: 8,
    TensorProto.UINT64: 8,
    TensorProto.BOOL: 1,
}
_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}

# (domain, op type) -> input indices whose values the inference never reads (None: every input).
Unread = Mapping[tuple[str, str], "tuple[int, ...] | None"]

_WEIGHTED: dict[tuple[str, str], tuple[int, ...] | None] = {
    ("", "MatMul"): None,
    ("", "Gemm"): None,
    ("", "Conv"): None,
    ("", "ConvTranspose"): None,
    ("", "LSTM"): None,
    ("", "GRU"): None,
    ("", "RNN"): None,
    ("", "BatchNormalization"): None,
    ("", "InstanceNormalization"): None,
    ("", "LayerNormalization"): None,
    ("", "PRelu"): None,
    ("", "Gather"): (0,),  # the table; the indices may be read
}
# onnx's C++ inference (data propagation off): no values of elementwise inputs either, and no
# inference at all for com.microsoft ops (onnx has no schema for them).
UNREAD_BY_ONNX: Unread = {
    **_WEIGHTED,
    ("", "Add"): None,
    ("", "Sub"): None,
    ("", "Mul"): None,
    ("", "Div"): None,
}
# onnxruntime's symbolic inference computes Add/Sub/Mul/Div/... on known values (so they stay);
# its com.microsoft handlers read shapes only.
UNREAD_BY_SYMBOLIC: Unread = {
    **_WEIGHTED,
    **{
        ("com.microsoft", op): None
        for op in (
            "FusedMatMul",
            "FusedGemm",
            "FusedConv",
            "NhwcConv",
            "BiasGelu",
            "FastGelu",
            "Gelu",
            "QuickGelu",
            "BiasAdd",
            "SkipLayerNormalization",
            "SkipSimplifiedLayerNormalization",
            "SimplifiedLayerNormalization",
            "LayerNormalization",
            "Attention",
            "MultiHeadAttention",
            "EmbedLayerNormalization",
        )
    },
}


def raw_size(tensor: TensorProto) -> int:
    """len(tensor.raw_data) without copying a large weight into Python: its dims tell, for a valid tensor."""
    itemsize = _ITEMSIZE.get(tensor.data_type)
    if itemsize is not None:
        size = itemsize
        for dim in tensor.dims:
            size *= dim
        if size >= LARGE:
            return size
    return len(tensor.raw_data)


def unread_weights(graph: onnx.GraphProto, unread: Unread) -> Iterator[TensorProto]:
    """The main graph's large float initializers whose values no node's inference reads (per ``unread``)."""
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    inner: set[str] = set()
    for node in graph.node:
        for index, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, index))
        for attribute in node.attribute:
            if attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                inner |= _names_in(attribute)
    outputs = {value.name for value in graph.output} | {value.name for value in graph.input}
    for tensor in graph.initializer:
        if tensor.data_type not in _FLOATS or not tensor.HasField("raw_data") or raw_size(tensor) < LARGE:
            continue
        if tensor.name in outputs or tensor.name in inner or tensor.name not in readers:
            continue
        if all(_unread(node, index, unread) for node, index in readers[tensor.name]):
            yield tensor


def without_weights(model: onnx.ModelProto, unread: Unread) -> onnx.ModelProto:
    """A copy of ``model`` without the bytes of its :func:`unread_weights` (same initializers, types, dims)."""
    names = {tensor.name for tensor in unread_weights(model.graph, unread)}
    return stripped(model, lambda _, tensor: tensor.name in names)


def _unread(node: onnx.NodeProto, index: int, unread: Unread) -> bool:
    domain = "" if node.domain == "ai.onnx" else node.domain
    if domain == "com.microsoft" and unread is UNREAD_BY_ONNX:  # no onnx schema: no inference at all
        return True
    if (domain, node.op_type) not in unread:
        return False
    indices = unread[(domain, node.op_type)]
    return indices is None or index in indices


def _names_in(attribute: onnx.AttributeProto) -> set[str]:
    """Every name a subgraph attribute's nodes read (and its outputs), nested ones included."""
    names: set[str] = set()
    for graph in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs):
        for node in graph.node:
            names.update(node.input)
            for inner in node.attribute:
                if inner.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                    names |= _names_in(inner)
        names.update(value.name for value in graph.output)
    return names
