"""Step: onnxruntime's basic graph optimizations, saved: the graph the quantizers assume.

The quantizers expect weights and biases as initializers and BatchNorm folded; the basic level
does that with standard ops only, as a session would anyway. MatMul+Add -> Gemm is left out,
because ``quantize_dynamic`` quantizes MatMul but not Gemm.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx
import onnxruntime as ort

from quantune.prepare._files import save_model

# Basic-level onnxruntime optimizers whose output the quantizers treat worse than their input.
KEPT_UNFUSED = ("MatMulAddFusion",)


def basic_cleanup(model: onnx.ModelProto, work_dir: Path) -> tuple[onnx.ModelProto, list[str]]:
    source = work_dir / "cleanup_in.onnx"
    target = work_dir / "cleanup_out.onnx"
    save_model(model, source)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(target)
    options.log_severity_level = 3
    if (work_dir / "cleanup_in.onnx.data").exists():
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "cleanup.data")
    ort.InferenceSession(
        str(source), options, providers=["CPUExecutionProvider"], disabled_optimizers=list(KEPT_UNFUSED)
    )
    cleaned = onnx.load(str(target))
    _drop_unused_domains(cleaned)
    before, after = _op_counts(model), _op_counts(cleaned)
    if before == after:
        return model, []  # nothing folded or fused: keep the graph as the user wrote it
    changed = sorted(set(before) | set(after))
    diff = ", ".join(f"{op} {after[op] - before[op]:+d}" for op in changed if after[op] != before[op])
    total_before, total_after = sum(before.values()), sum(after.values())
    return cleaned, [f"graph clean-up (onnxruntime basic): {total_before} -> {total_after} nodes ({diff})"]


def _op_counts(model: onnx.ModelProto) -> Counter[str]:
    return Counter(node.op_type for node in model.graph.node)


def _drop_unused_domains(model: onnx.ModelProto) -> None:
    """onnxruntime's saved model imports every domain it knows (training, nchwc, aten, ...);
    keep the default domain and the domains a node uses, as the user's model did."""
    used = {"", "ai.onnx"} | _domains(model.graph) | {function.domain for function in model.functions}
    kept = [entry for entry in model.opset_import if entry.domain in used]
    del model.opset_import[:]
    model.opset_import.extend(kept)


def _domains(graph: onnx.GraphProto) -> set[str]:
    found: set[str] = set()
    for node in graph.node:
        found.add(node.domain)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                found |= _domains(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for sub in attribute.graphs:
                    found |= _domains(sub)
    return found
