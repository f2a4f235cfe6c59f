"""``static_quant``'s onnxruntime knobs: calibration options and model-changing ``extra_options``.

Each config field maps to one ``quantize_static`` extra option; the calibration ones are applied
by quantune's chunked calibration as onnxruntime's would. A field at its default adds nothing.
"""

from __future__ import annotations

from typing import Any

# field -> (extra option, default)
MODEL_OPTIONS: dict[str, tuple[str, Any]] = {
    "keep_removable_activations": ("QDQKeepRemovableActivations", False),
    "add_qdq_pair_to_weight": ("AddQDQPairToWeight", False),
    "dedicated_qdq_pair": ("DedicatedQDQPair", False),
    "quantize_bias": ("QuantizeBias", True),
    "activation_restricted_asymmetric": ("ActivationRestrictedAsymmetric", False),
    "force_quantize_no_input_check": ("ForceQuantizeNoInputCheck", False),
    "matmul_const_b_only": ("MatMulConstBOnly", False),
    "minimum_real_range": ("MinimumRealRange", None),
}
CALIBRATION_OPTIONS: dict[str, tuple[str, Any]] = {
    "calib_moving_average": ("CalibMovingAverage", False),
    "calib_moving_average_constant": ("CalibMovingAverageConstant", 0.01),
    "calib_tensor_range_symmetric": ("CalibTensorRangeSymmetric", False),
}
_QDQ_ONLY = ("keep_removable_activations", "add_qdq_pair_to_weight", "dedicated_qdq_pair")


def check_calibration_options(config: Any) -> None:
    """Combinations onnxruntime ignores or cannot do are errors (so a search never runs them)."""
    if config.calib_moving_average and config.calibrate_method != "MinMax":
        raise ValueError(
            "calib_moving_average needs calibrate_method 'MinMax' (onnxruntime averages MinMax ranges only)"
        )
    if config.calib_strided_minmax is not None and not config.calib_moving_average:
        raise ValueError("calib_strided_minmax needs calib_moving_average (without it, strides give the same min/max)")
    if config.calib_moving_average_constant != 0.01 and config.calib_strided_minmax is None:
        raise ValueError(
            "calib_moving_average_constant merges strides: set calib_strided_minmax too (one pass over the data "
            "averages the batches' ranges, the constant is not used)"
        )
    if config.quant_format != "QDQ":
        for name in _QDQ_ONLY:
            if getattr(config, name):
                raise ValueError(f"{name} applies to quant_format 'QDQ' only")
    if config.activation_restricted_asymmetric and config.activation_type != "uint8":
        raise ValueError("activation_restricted_asymmetric applies to activation_type 'uint8' only")


def model_options(config: Any, table: dict[str, tuple[str, Any]] = MODEL_OPTIONS) -> dict[str, Any]:
    """The extra options of ``table`` (the model-changing ones by default) whose field is not at its default."""
    return {
        option: getattr(config, field)
        for field, (option, default) in table.items()
        if getattr(config, field) != default
    }


def calibration_options(config: Any) -> dict[str, Any]:
    return model_options(config, CALIBRATION_OPTIONS)


def calibration_key(config: Any) -> list[Any]:
    """Cache-key parts for the calibration options (none at the defaults)."""
    options = calibration_options(config)
    if config.calib_strided_minmax is not None:
        options["CalibStridedMinMax"] = config.calib_strided_minmax
    return [sorted(options.items())] if options else []
