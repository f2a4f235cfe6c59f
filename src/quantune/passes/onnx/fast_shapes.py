"""onnxruntime's quantizer's shape inference, in memory, and the models between its calls kept in memory.

``quantize_dynamic`` (and the static build, twice) writes and reads the whole model through
temporary files for onnx's shape inference, which needs no weights. :func:`in_memory_shapes`
swaps in functions that give the very same model without the files: the inference runs on a
*skeleton* whose large weights' bytes are taken out (marked external exactly where the file
round trip would hide them, and put back as ``onnx.load`` would read them), and a model the pass
hands over (:class:`ModelStore`) never goes through a file. A model with external data, or too
large to serialize in one piece, keeps onnxruntime's own functions.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto

from quantune.model import copy_fields, stripped
from quantune.passes.onnx.skeleton import UNREAD_BY_ONNX, raw_size, unread_weights

_LOCK = threading.Lock()
EXTERNAL_THRESHOLD = 1024  # onnx.save_model's size_threshold: tensors it writes as external data
_BYTES_OVERHEAD = sys.getsizeof(b"")  # onnx compares sys.getsizeof(raw_data) with the threshold
_TENSOR_FIELDS = {
    "dims",
    "data_type",
    "segment",
    "float_data",
    "int32_data",
    "string_data",
    "int64_data",
    "name",
    "doc_string",
    "raw_data",
    "external_data",
    "data_location",
    "double_data",
    "uint64_data",
    "metadata_props",
}
_DATA_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")
_LIMIT = 2**31 - 2**26  # what fits in one serialized protobuf, with room to spare


class ModelStore:
    """Models handed between the pass and onnxruntime's quantizer by path, without the file."""

    def __init__(self) -> None:
        self._models: dict[str, onnx.ModelProto | None] = {}

    def expect(self, path: Path) -> None:
        """The quantizer's save into ``path`` is kept here instead of being written."""
        self._models.setdefault(_key(path), None)

    def put(self, path: Path, model: onnx.ModelProto) -> None:
        self._models[_key(path)] = model

    def expects(self, path: str | Path) -> bool:
        return _key(path) in self._models

    def take(self, path: str | Path) -> onnx.ModelProto | None:
        """The model held for ``path`` (once), or None."""
        return self._models.pop(_key(path), None)


def _key(path: str | Path) -> str:
    return str(Path(path).resolve())


def fits_in_memory(path: Path) -> bool:
    """Whether a model file can take the in-memory path: no external data, under protobuf's limit."""
    from quantune.model import external_data_files

    return path.stat().st_size < _LIMIT and not external_data_files(path)


def infer_like_file(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """``save_and_reload_model_with_shape_infer(model)``'s result, without files (None: not here)."""
    if _has_external(model):
        return None
    tensors = list(_all_initializers(model))
    hidden = [
        i
        for i, t in enumerate(tensors)
        if t.HasField("raw_data") and raw_size(t) + _BYTES_OVERHEAD >= EXTERNAL_THRESHOLD
    ]
    if any(i >= len(model.graph.initializer) for i in hidden):  # a subgraph's weight: the copying way
        return _infer_copying(model, hidden, external=True)
    skeleton = _skeleton(model, set(hidden), external=True)
    if skeleton is None:
        return _infer_copying(model, hidden, external=True)
    inferred = onnx.shape_inference.infer_shapes(skeleton)
    targets = list(inferred.graph.initializer)
    if len(targets) != len(model.graph.initializer):
        return None
    for index in hidden:  # the one copy of the weights the new model needs
        target, original = targets[index], model.graph.initializer[index]
        if target.name != original.name:
            return None
        target.CopyFrom(original)
        _as_loaded(target)
    return inferred


def infer_loaded(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """What ``infer_shapes_path`` then ``onnx.load`` give for ``model`` saved as one file (None: not
    here), written into ``model`` itself: it must be a model nobody else holds."""
    if _has_external(model):
        return None
    unread = {t.name for t in unread_weights(model.graph, UNREAD_BY_ONNX)}
    hidden = {i for i, t in enumerate(model.graph.initializer) if t.name in unread}
    skeleton = _skeleton(model, hidden, external=False)
    if skeleton is None:
        return _infer_copying(model, sorted(hidden), external=False)
    inferred = onnx.shape_inference.infer_shapes(skeleton)
    if [t.name for t in inferred.graph.initializer] != [t.name for t in model.graph.initializer]:
        return None
    _take_all_but_initializers(model, inferred)
    return model


def _skeleton(model: onnx.ModelProto, hidden: set[int], *, external: bool) -> onnx.ModelProto | None:
    """``model`` without the bytes of its initializers at ``hidden``; None for unknown tensor fields."""
    if {f.name for f in TensorProto.DESCRIPTOR.fields} != _TENSOR_FIELDS:
        return None
    tensors = model.graph.initializer
    if any(len(getattr(tensors[index], name)) for index in hidden for name in _DATA_FIELDS):
        return None  # raw bytes and typed data both: not a tensor to second-guess
    return stripped(model, lambda index, _: index in hidden, external=external)


def _take_all_but_initializers(model: onnx.ModelProto, inferred: onnx.ModelProto) -> None:
    """``model`` gets every field of ``inferred`` but the main graph's initializers (they are the same)."""
    for field in onnx.ModelProto.DESCRIPTOR.fields:
        if field.name != "graph":
            model.ClearField(field.name)
    copy_fields(inferred, model, skip="graph")
    for field in onnx.GraphProto.DESCRIPTOR.fields:
        if field.name != "initializer":
            model.graph.ClearField(field.name)
    copy_fields(inferred.graph, model.graph, skip="initializer")


def _infer_copying(model: onnx.ModelProto, hidden: list[int], *, external: bool) -> onnx.ModelProto | None:
    """onnx's inference of a serialized copy of ``model`` without the bytes of the initializers at ``hidden``."""
    skeleton = onnx.ModelProto()
    skeleton.CopyFrom(model)
    tensors = list(_all_initializers(skeleton))
    for index in hidden:
        tensors[index].ClearField("raw_data")
        if external:
            tensors[index].data_location = TensorProto.EXTERNAL
    inferred = onnx.shape_inference.infer_shapes(skeleton)
    originals = list(_all_initializers(model))
    targets = list(_all_initializers(inferred))
    if len(targets) != len(originals):
        return None
    for index in hidden:
        target, original = targets[index], originals[index]
        if target.name != original.name:
            return None
        target.CopyFrom(original)
        if external:
            _as_loaded(target)
    return inferred


def _as_loaded(tensor: TensorProto) -> None:
    """What ``onnx.load`` does to a tensor it reads from external data (load_external_data_for_tensor)."""
    tensor.data_location = TensorProto.DEFAULT
    del tensor.external_data[:]


def _all_initializers(model: onnx.ModelProto) -> Iterator[TensorProto]:
    """Every initializer, subgraphs' included, in onnx's external-data order."""
    from onnx.external_data_helper import _get_initializer_tensors

    return iter(_get_initializer_tensors(model))


def _has_external(model: onnx.ModelProto) -> bool:
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    return any(uses_external_data(tensor) for tensor in _get_all_tensors(model))


@contextlib.contextmanager
def in_memory_shapes(store: ModelStore | None = None) -> Iterator[None]:
    """onnxruntime's quantizer infers shapes in memory (and uses ``store``) meanwhile."""
    # by module path: the package's attribute ``quantize`` is the function, not the module
    quant_utils, quantize, onnx_quantizer, base_quantizer, calibrate, onnx_model = (
        importlib.import_module(f"onnxruntime.quantization.{name}")
        for name in ("quant_utils", "quantize", "onnx_quantizer", "base_quantizer", "calibrate", "onnx_model")
    )
    store = store or ModelStore()
    # calibrate: its calibrator loads the model it augments the same way (the static build)
    modules = (quant_utils, quantize, onnx_quantizer, base_quantizer, calibrate)
    names = ("load_model_with_shape_infer", "save_and_reload_model_with_shape_infer")
    with _LOCK:
        originals = {
            (module, name): getattr(module, name) for module in modules for name in names if hasattr(module, name)
        }
        original_load = quant_utils.load_model_with_shape_infer
        original_reload = quant_utils.save_and_reload_model_with_shape_infer
        original_save = onnx_model.ONNXModel.save_model_to_file
        replacements = {
            "load_model_with_shape_infer": _load(original_load, store, quant_utils.add_infer_metadata),
            "save_and_reload_model_with_shape_infer": _reload(original_reload, quant_utils.add_infer_metadata),
        }
        for module, name in originals:
            setattr(module, name, replacements[name])
        onnx_model.ONNXModel.save_model_to_file = _save(original_save, store)
        try:
            yield
        finally:
            for (module, name), function in originals.items():
                setattr(module, name, function)
            onnx_model.ONNXModel.save_model_to_file = original_save


def _load(original: Any, store: ModelStore, add_metadata: Any) -> Any:
    def load_model_with_shape_infer(model_path: Path) -> onnx.ModelProto:
        path = Path(model_path)
        model = store.take(path)
        if model is None:
            if path.suffix != ".onnx" or not fits_in_memory(path):
                return original(model_path)
            model = onnx.load(str(path))
            inferred = infer_loaded(model)
            if inferred is None:
                return original(model_path)
        else:
            inferred = infer_loaded(model)
            if inferred is None:  # onnxruntime's own way, from the file it would have read
                onnx.save(model, str(path))
                return original(model_path)
        add_metadata(inferred)
        return inferred

    return load_model_with_shape_infer


def _reload(original: Any, add_metadata: Any) -> Any:
    def save_and_reload_model_with_shape_infer(model: onnx.ModelProto) -> onnx.ModelProto:
        inferred = infer_like_file(model)
        if inferred is None:
            return original(model)
        add_metadata(inferred)
        return inferred

    return save_and_reload_model_with_shape_infer


def _save(original: Any, store: ModelStore) -> Any:
    def save_model_to_file(self: Any, output_path: str, use_external_data_format: bool = False) -> None:
        if use_external_data_format or not store.expects(output_path):
            return original(self, output_path, use_external_data_format)
        # onnxruntime's save_model_to_file (onnx_model.py) up to its onnx.save_model
        self.topological_sort()
        for init in self.model.graph.initializer:
            self._check_init(init, "end")
        store.put(Path(output_path), self.model)
        return None

    return save_model_to_file
