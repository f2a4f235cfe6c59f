"""What the int8 quantizers can take from the passes added for transformers and size
(transformer_opt, weight_only, fp16): one place, called from each quantizer's ``accepts``.

After ``transformer_opt`` QOperator ``quantize_static`` fails inside the quantizer (QDQ and
dynamic work); after ``fp16`` there are no float32 tensors to calibrate; after ``weight_only``
the remaining float ops can still be made int8.
"""

from __future__ import annotations

from quantune.passes.base import PassConfig


def quantizer_accepts(quantizer: str, config: PassConfig, upstream: list[tuple[str, PassConfig]]) -> bool:
    """Whether ``quantizer`` (static_quant, dynamic_quant) with ``config`` can follow ``upstream``."""
    names = [name for name, _ in upstream]
    if "fp16" in names:
        return False
    return not (
        quantizer == "static_quant"
        and getattr(config, "quant_format", None) == "QOperator"
        and "transformer_opt" in names
    )
