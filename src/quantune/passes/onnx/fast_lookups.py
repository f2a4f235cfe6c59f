"""Two of onnxruntime's quantizer look-ups, done without visiting what cannot match.

``ONNXModel.replace_input_of_all_nodes`` and ``quant_utils.find_by_name`` walk the whole graph
in Python on every call: quadratic in the graph's size. Here a node is edited only when the name
is among its inputs, and the scan stops at the first match: the same model to the byte.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Iterator
from typing import Any

_LOCK = threading.Lock()
_DEPTH = [0]  # nested or concurrent builds in one process: the first in swaps, the last out restores
_SAVED: dict[tuple[Any, str], Any] = {}
# the modules that imported ``find_by_name`` by name (each holds its own reference)
_FINDERS = ("quant_utils", "onnx_model", "base_quantizer", "onnx_quantizer", "qdq_quantizer", "calibrate")


def find_by_name(item_name: str, item_list: Any) -> Any:
    """``quant_utils.find_by_name``: the first item named ``item_name``, or None -- stopping there."""
    return next((item for item in item_list if item.name == item_name), None)


def _replace_input_of_all_nodes(self: Any, old_input_name: str, new_input_name: str) -> None:
    """``ONNXModel.replace_input_of_all_nodes``, editing only the nodes that read ``old_input_name``."""
    assert isinstance(old_input_name, str) and isinstance(new_input_name, str)  # as replace_node_input checks
    for node in self.model.graph.node:
        if old_input_name in node.input:
            type(self).replace_node_input(node, old_input_name, new_input_name)


def _replace_input_of_nodes(self: Any, old_input_name: str, new_input_name: str, node_names_set: Any) -> None:
    """``ONNXModel.replace_input_of_nodes``, the same way."""
    assert isinstance(old_input_name, str) and isinstance(new_input_name, str)
    for node in self.model.graph.node:
        if node.name in node_names_set and old_input_name in node.input:
            type(self).replace_node_input(node, old_input_name, new_input_name)


def _targets() -> list[tuple[Any, str, Any]]:
    """(owner, attribute, replacement) for each swap this onnxruntime has room for."""
    modules = {}
    for name in _FINDERS:
        with contextlib.suppress(ImportError):
            modules[name] = importlib.import_module(f"onnxruntime.quantization.{name}")
    targets: list[tuple[Any, str, Any]] = []
    original = getattr(modules.get("quant_utils"), "find_by_name", None)
    for module in modules.values():
        if original is not None and getattr(module, "find_by_name", None) is original:
            targets.append((module, "find_by_name", find_by_name))
    model_class = getattr(modules.get("onnx_model"), "ONNXModel", None)
    for attribute, replacement in (
        ("replace_input_of_all_nodes", _replace_input_of_all_nodes),
        ("replace_input_of_nodes", _replace_input_of_nodes),
    ):
        if model_class is not None and hasattr(model_class, attribute) and hasattr(model_class, "replace_node_input"):
            targets.append((model_class, attribute, replacement))
    return targets


@contextlib.contextmanager
def fast_lookups() -> Iterator[None]:
    """onnxruntime's quantizer with the look-ups above meanwhile (its own again afterwards)."""
    with _LOCK:
        if _DEPTH[0] == 0:
            for owner, attribute, replacement in _targets():
                _SAVED[(owner, attribute)] = getattr(owner, attribute)
                setattr(owner, attribute, replacement)
        _DEPTH[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                for (owner, attribute), function in _SAVED.items():
                    setattr(owner, attribute, function)
                _SAVED.clear()
