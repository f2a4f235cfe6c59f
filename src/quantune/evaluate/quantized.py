"""What a candidate actually quantized: its quantized compute ops, counted from its graph.

A flow says what was *asked*: a pass with every group excluded, or a quantizer that skipped ops,
writes a model that is float where it matters (the original in disguise). So every evaluated
model gets ``quantized_ops`` (integer kernels, and QDQ compute ops whose data and weight both
come from a ``DequantizeLinear``, plus what the run's passes declare in ``leaves_quantized``)
and ``quantized_compute_fraction`` over the candidate's own compute ops (fusion changes the
count, so the original's would misstate a fused model). The graph is walked; weights are not loaded.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from quantune.model import graphs

# Ops that compute in integer arithmetic (QOperator format, dynamic quantization, weight-only kernels).
QUANTIZED_COMPUTE_OPS = frozenset(
    {
        "QLinearConv",
        "QLinearMatMul",
        "ConvInteger",
        "MatMulInteger",
        "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul",
        "QGemm",
        "QAttention",
        "QOrderedAttention",
        "QOrderedMatMul",
        "QLinearConvTranspose",
        "DynamicQuantizeLSTM",
        "MatMulNBits",
        "MatMulBnb4",
        "GatherBlockQuantized",
    }
)
# Ops that carry a model's compute when they run in float.
FLOAT_COMPUTE_OPS = frozenset(
    {
        "Conv",
        "ConvTranspose",
        "MatMul",
        "Gemm",
        "Attention",
        "MultiHeadAttention",
        "LSTM",
        "GRU",
        "RNN",
        "FusedConv",
        "FusedGemm",
        "FusedMatMul",
        "NchwcConv",
    }
)
# Input index of the weight, per float compute op (the data input is index 0).
_WEIGHT_INPUT = {"Conv": 1, "ConvTranspose": 1, "MatMul": 1, "Gemm": 1, "Attention": 1, "LSTM": 1, "GRU": 1}


def count_quantized(model: onnx.ModelProto, also: frozenset[str] = frozenset()) -> tuple[int, int]:
    """(quantized compute ops, all compute ops), subgraphs included; ``also``: what the passes leave quantized."""
    kernels = QUANTIZED_COMPUTE_OPS | (also - FLOAT_COMPUTE_OPS)
    weight_only = also & FLOAT_COMPUTE_OPS
    quantized = total = 0
    for graph in graphs(model.graph):
        dequantized = {out for node in graph.node if node.op_type == "DequantizeLinear" for out in node.output}
        for node in graph.node:
            if node.op_type in kernels:
                quantized += 1
                total += 1
            elif node.op_type in FLOAT_COMPUTE_OPS:
                total += 1
                weight = _WEIGHT_INPUT.get(node.op_type)
                inputs = list(node.input)
                if weight is None or len(inputs) <= weight or inputs[weight] not in dequantized:
                    continue
                if inputs[0] in dequantized or node.op_type in weight_only:
                    quantized += 1
    return quantized, total


def count_float16(model: onnx.ModelProto) -> int:
    """Float compute ops with a float16 weight: reduced precision, though nothing is quantized."""
    count = 0
    for graph in graphs(model.graph):
        half = {init.name for init in graph.initializer if init.data_type == onnx.TensorProto.FLOAT16}
        for node in graph.node:
            weight = _WEIGHT_INPUT.get(node.op_type)
            if weight is not None and len(node.input) > weight and node.input[weight] in half:
                count += 1
    return count


def quantization_figures(model_path: str | Path, also: frozenset[str] = frozenset()) -> dict[str, float]:
    """``quantized_ops``, ``quantized_compute_fraction`` and ``float16_ops`` of the model file."""
    model = onnx.load(str(model_path), load_external_data=False)
    quantized, total = count_quantized(model, also)
    return {
        "quantized_ops": quantized,
        "quantized_compute_fraction": quantized / total if total else 0.0,
        "float16_ops": count_float16(model),
    }
