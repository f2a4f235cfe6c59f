"""What the int8 quantizers can take from the passes added for transformers and size
(transformer_opt, weight_only, fp16): one place, called from each quantizer's ``accepts``.

Checked with a tiny BERT layer (tests/bert_model.py):

* after ``transformer_opt``, ``quantize_static`` in QOperator format fails inside the
  quantizer (``'NoneType' object has no attribute 'extend'`` on the fused graph); QDQ works
  and ``quantize_dynamic`` works (QAttention, QEmbedLayerNormalization);
* after ``fp16`` the weights and activations are float16, which the int8 quantizers do not
  calibrate or quantize (they assume float32 tensors);
* after ``weight_only`` the remaining float MatMuls (its ``nodes_to_exclude``) and other ops
  can still be made int8: allowed.
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
