"""onnxruntime's extended graph optimization before dynamic quantization (Neural Compressor's recipe).

Fused LayerNorm, Gelu+bias and scaled MatMuls make the int8 model faster for the same int8
MatMuls. Two things keep the fused model quantizable: the convolution fusions are left out (a
fused Conv is a com.microsoft op the quantizer skips), and onnxruntime's symbolic shape
inference types the fused ops onnx's inference does not know (the quantizer skips untyped
nodes); those types are removed again from the quantized model, which runs slower with them.
The symbolic inference runs on the model's skeleton (:mod:`.skeleton`), sparing weight copies.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import onnx
import onnxruntime as ort

from quantune.model import external_data_files
from quantune.passes.onnx.skeleton import UNREAD_BY_SYMBOLIC, without_weights
from quantune.prepare.shapes import symbolic_infer

log = logging.getLogger("quantune.passes")

# Fusions that turn a Conv into an op the int8 quantizers do not quantize.
CONV_FUSIONS = ("ConvActivationFusion", "ConvAddFusion", "ConvAddActivationFusion")


def optimize_extended(model_in: Path, model_out: Path) -> list[str]:
    """``model_in`` at onnxruntime's extended level, typed, at ``model_out``; the names of the added types."""
    save_optimized(model_in, model_out, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, CONV_FUSIONS)
    model = onnx.load(str(model_out), load_external_data=False)
    added = add_types(model)
    if added:
        onnx.save(model, str(model_out))
    return added


def optimize_extended_model(model_in: Path, model_out: Path) -> tuple[onnx.ModelProto, list[str]]:
    """:func:`optimize_extended` for a model without external data, the typed model kept in memory."""
    save_optimized(model_in, model_out, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, CONV_FUSIONS)
    model = onnx.load(str(model_out))
    return model, add_types(model)


def save_optimized(
    model_in: Path, model_out: Path, level: ort.GraphOptimizationLevel, disabled: Sequence[str] = ()
) -> None:
    """onnxruntime's CPU graph optimizer at ``level`` without ``disabled``, its model saved at ``model_out``."""
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.optimized_model_filepath = str(model_out)
    options.log_severity_level = 3
    if external_data_files(model_in):  # else the saved model points at the input's data files
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", model_out.name + ".data"
        )
    ort.InferenceSession(
        str(model_in), options, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled) or None
    )


def drop_types(path: Path, names: list[str]) -> None:
    """Removes the value infos of ``names`` from the model at ``path`` (the quantized model)."""
    if not names:
        return
    model = onnx.load(str(path), load_external_data=False)
    drop_value_infos(model, names)
    onnx.save(model, str(path))


def drop_value_infos(model: onnx.ModelProto, names: list[str]) -> bool:
    """:func:`drop_types` on a model in memory; whether it had any to drop (the names given)."""
    if not names:
        return False
    drop = set(names)
    kept = [info for info in model.graph.value_info if info.name not in drop]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    return True


def add_types(model: onnx.ModelProto) -> list[str]:
    """Value infos from symbolic shape inference added to ``model`` (where it follows the graph); their names."""
    try:  # on the model's skeleton: the same value infos, without copying its weights (skeleton.py)
        typed = symbolic_infer(without_weights(model, UNREAD_BY_SYMBOLIC), guess_output_rank=True)
    except Exception as exc:  # an op it cannot follow: the quantizer's DefaultTensorType stands
        log.info("extended optimization: no symbolic types (%s: %s)", type(exc).__name__, exc)
        return []
    known = {info.name for info in model.graph.value_info}
    added = [info for info in typed.graph.value_info if info.name not in known]
    if added:
        model.graph.value_info.extend(added)
    return [info.name for info in added]
