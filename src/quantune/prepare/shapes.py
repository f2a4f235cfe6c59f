"""Step: symbolic shape inference, where onnx's own inference leaves tensors without a shape.

onnxruntime's symbolic inference follows symbolic dimensions where onnx's gives up; its result
is kept only when it shapes more tensors, and when it raises the model is kept as it is.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
import tempfile
import threading
from pathlib import Path

import onnx

from quantune.model import with_weights, without_weights

log = logging.getLogger("quantune.prepare")


def infer_shapes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    # Both inferences run without the weights' values (they read types and dims only): cheaper copies.
    light = without_weights(model)
    baseline = _shaped(_onnx(light) or light)  # what the quantizers will see anyway
    if baseline >= len(_intermediates(light)):  # nothing left to shape
        return model, []
    symbolic = _symbolic(light)
    if symbolic is None or _shaped(symbolic) <= baseline:
        return model, []
    symbolic = with_weights(symbolic, model)
    if symbolic is None:  # not expected (inference writes value infos only); then the model stays as it is
        return model, []
    return symbolic, [f"shape inference (symbolic): {_shaped(symbolic)} tensors shaped, onnx's inference {baseline}"]


def _symbolic(model: onnx.ModelProto) -> onnx.ModelProto | None:
    try:
        return symbolic_infer(model, guess_output_rank=False)
    except Exception as exc:  # ImportError (no sympy), or an op it cannot follow
        log.info("symbolic shape inference failed (%s: %s); onnx's inference stands", type(exc).__name__, exc)
        return None


def symbolic_infer(model: onnx.ModelProto, *, guess_output_rank: bool) -> onnx.ModelProto:
    """onnxruntime's symbolic shape inference of ``model``, run in a scratch folder: on failure it
    saves temporary files into the working directory, which would be the user's folder."""
    previous = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="quantune-shapes-") as scratch:
        os.chdir(scratch)
        try:
            return symbolic_shape_inference().infer_shapes(model, auto_merge=True, guess_output_rank=guess_output_rank)
        finally:
            os.chdir(previous)


def symbolic_shape_inference() -> type:
    """onnxruntime's ``SymbolicShapeInference``, loaded from its file: the ``onnxruntime.tools``
    package's ``__init__`` imports torch whenever it is installed."""
    name = "onnxruntime.tools.symbolic_shape_infer"
    with _LOADING:  # one load, whole, though a thread loads it ahead (``load_in_background``)
        module = sys.modules.get(name) or sys.modules.get("_quantune_symbolic_shape_infer")
        if module is None:
            import onnxruntime

            path = Path(onnxruntime.__file__).parent / "tools" / "symbolic_shape_infer.py"
            spec = importlib.util.spec_from_file_location("_quantune_symbolic_shape_infer", path)
            if spec is None or spec.loader is None:
                raise ImportError(f"no {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[spec.name]  # not left half loaded: the next use tries again, and says why
                raise
    return module.SymbolicShapeInference


_LOADING = threading.Lock()


def load_in_background() -> None:
    """Starts loading the symbolic shape inference (and sympy) in a thread of a worker that will need
    it, so the load overlaps the worker's set-up; the fork server does not, as it would delay every run."""
    if "_quantune_symbolic_shape_infer" in sys.modules or "onnxruntime.tools.symbolic_shape_infer" in sys.modules:
        return

    def load() -> None:
        with contextlib.suppress(Exception):  # without sympy: its first use says why, as before
            symbolic_shape_inference()

    threading.Thread(target=load, name="quantune-load-shapes", daemon=True).start()


def _onnx(model: onnx.ModelProto) -> onnx.ModelProto | None:
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:
        log.info("onnx shape inference failed (%s: %s)", type(exc).__name__, exc)
        return None


def _intermediates(model: onnx.ModelProto) -> set[str]:
    """The main graph's tensors that nodes produce, graph outputs aside (what ``_shaped`` counts)."""
    outputs = {out.name for out in model.graph.output}
    return {name for node in model.graph.node for name in node.output if name and name not in outputs}


def _shaped(model: onnx.ModelProto) -> int:
    """Intermediate tensors (not graph outputs) whose type and every dimension (a number or a
    symbol) value_info knows."""
    outputs = {out.name for out in model.graph.output}
    return sum(1 for info in model.graph.value_info if info.name not in outputs and _known(info.type.tensor_type))


def _known(tensor_type: onnx.TypeProto.Tensor) -> bool:
    if not tensor_type.elem_type or not tensor_type.HasField("shape"):
        return False
    return all(dim.HasField("dim_value") or dim.HasField("dim_param") for dim in tensor_type.shape.dim)
