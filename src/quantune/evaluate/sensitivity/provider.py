"""Per-node quantization error as a given execution provider runs the quantized model (the culprits may differ from the
CPU's): both models run there with every float tensor exposed, and a node scores the error its output adds over its
inputs'."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

Feeds = list[dict[str, np.ndarray]]
HELD_BYTES = 256 * 2**20  # the exposed tensors of both models a call may return: memory stays bounded
RunOutputs = Callable[[Path, Feeds], list[Mapping[str, np.ndarray]]]  # (model, feeds) -> outputs per feed


def float_tensors(model: onnx.ModelProto) -> list[str]:
    """The float tensors nodes produce, in graph order (shape inference's types)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.value_info, *inferred.graph.output]}
    names = [out for node in model.graph.node for out in node.output if out]
    return [name for name in names if types.get(name) == TensorProto.FLOAT]


def exposed(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose outputs are ``names`` (those it produces) besides its own."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    produced = {out for node in copy.graph.node for out in node.output}
    present = {out.name for out in copy.graph.output}
    for name in names:
        if name in produced and name not in present:
            copy.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    return copy


def measure_on_provider(
    float_path: Path, quant_path: Path, feeds: Feeds, run: RunOutputs, folder: Path
) -> dict[str, float]:
    """Each float node's output error in the quantized model less its worst input's (at least zero)."""
    fmodel, qmodel = onnx.load(str(float_path)), onnx.load(str(quant_path))
    qnames = {out for node in qmodel.graph.node for out in node.output}
    produced = float_tensors(fmodel)
    names = [name for name in produced if name in qnames]
    gone = set(produced) - qnames  # fused away by the quantizer
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "float.onnx", folder / "quant.onnx"
    for path, model in zip(paths, (fmodel, qmodel), strict=True):
        onnx.save(exposed(model, names), str(path), save_as_external_data=True, location=f"{path.name}.data")
    error = dict.fromkeys(names, 0.0)
    power = dict.fromkeys(names, 0.0)
    size, start = 1, 0  # the first feed alone: its outputs' size sets how many feeds a call may hold
    while start < len(feeds):
        chunk = feeds[start : start + size]
        reference, quantized = run(paths[0], chunk), run(paths[1], chunk)
        held = 0
        for want, got in zip(reference, quantized, strict=True):
            for name in names:
                if name in want and name in got:
                    f = np.asarray(want[name], np.float64)
                    error[name] += float(np.sum((np.asarray(got[name], np.float64) - f) ** 2))
                    power[name] += float(np.sum(f**2))
                    held += 2 * f.nbytes
        start += len(chunk)
        size = max(1, int(HELD_BYTES * len(chunk) // max(1, held)))
    relative = {name: error[name] / power[name] if power[name] > 0 else 0.0 for name in names}
    producer = {out: node for node in fmodel.graph.node for out in node.output}

    def level(tensor: str, seen: frozenset[str] = frozenset()) -> float:
        """A tensor's error: measured, else (fused away in the quantized model) its producer's inputs'."""
        if tensor in relative:
            return relative[tensor]
        node = producer.get(tensor)
        if node is None or tensor in seen:
            return 0.0
        return max((level(i, seen | {tensor}) for i in node.input if i), default=0.0)

    scores: dict[str, float] = {}
    for node in fmodel.graph.node:
        outs = [relative[o] for o in node.output if o in relative]
        if not outs:
            continue
        added = max(0.0, max(outs) - max((level(i) for i in node.input if i), default=0.0))
        # what the quantizer fused into this node (a Conv's output folded into its Relu) did the work
        fused = [producer[i].name for i in node.input if i in gone]
        for name in fused or [node.name]:
            scores[name] = scores.get(name, 0.0) + added / max(1, len(fused))
    return scores
