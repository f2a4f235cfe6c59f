"""Names users write for onnxruntime's quantization enums."""

from __future__ import annotations

from typing import Literal

from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType

QuantTypeName = Literal["int8", "uint8", "int16", "uint16"]

QUANT_TYPES = {
    "int8": QuantType.QInt8,
    "uint8": QuantType.QUInt8,
    "int16": QuantType.QInt16,
    "uint16": QuantType.QUInt16,
}
QUANT_FORMATS = {"QDQ": QuantFormat.QDQ, "QOperator": QuantFormat.QOperator}
CALIBRATION_METHODS = {
    "MinMax": CalibrationMethod.MinMax,
    "Entropy": CalibrationMethod.Entropy,
    "Percentile": CalibrationMethod.Percentile,
    "Distribution": CalibrationMethod.Distribution,
}
