"""Step: the default-domain opset raised to what the run's passes need.

Per-channel QDQ needs ``DequantizeLinear``'s ``axis`` (opset 13); onnx's version converter
rewrites the ops whose signature changed. A model at or above the needed opset is left alone.
"""

from __future__ import annotations

import onnx
from onnx import version_converter

from quantune.model import with_weights, without_weights
from quantune.prepare.facts import default_opset


class OpsetError(RuntimeError):
    """onnx's version converter could not raise the opset."""


def raise_opset(model: onnx.ModelProto, wanted: int) -> tuple[onnx.ModelProto, list[str]]:
    current = default_opset(model)
    if not wanted or current >= wanted or current == 0:
        return model, []
    try:
        # without the weights' values (faster): the converter rewrites ops; one that touched a weight
        # is converted whole
        converted = with_weights(version_converter.convert_version(without_weights(model), wanted), model)
        if converted is None:
            converted = version_converter.convert_version(model, wanted)
    except Exception as exc:  # the converter raises bare RuntimeErrors and friends
        raise OpsetError(f"onnx's version converter cannot raise opset {current} to {wanted}: {exc}") from exc
    return converted, [f"opset {current} -> {wanted}"]
