"""Weight-only quantization: MatMul weights to 4 (or 8) bits in blocks, onnxruntime's ``MatMulNBits``.

Activations stay float; each constant MatMul weight is stored as 4-bit (or 8-bit) integers with
one scale (and zero point) per ``block_size`` rows of a column, dequantized on the fly by the
kernel. ``accuracy_level`` picks its compute type (4: int8, the fast one on CPUs). Algorithms:
``rtn`` and ``hqq`` (4 bits only, needs torch: ``pip install 'quantune[hqq]'``). GPTQ is left
out: onnxruntime runs it through its copy of Neural Compressor's code, which fails for RTN already.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import onnx
from pydantic import Field, field_validator, model_validator

from quantune.errors import TrialError
from quantune.passes.base import Knobs, Pass, PassConfig, PassContext
from quantune.passes.registry import facts_apply, register_pass, weights_rewritten
from quantune.space import Categorical, Conditional

HQQ_AVAILABLE = importlib.util.find_spec("torch") is not None


class WeightOnlyConfig(PassConfig):
    bits: Literal[4, 8] = 4
    block_size: int = Field(default=32, ge=16, le=1024)
    symmetric: bool = True
    accuracy_level: Literal[0, 1, 2, 3, 4] = 4  # int8 compute: the fast CPU kernel
    algorithm: Literal["rtn", "hqq"] = "rtn"
    nodes_to_exclude: list[str] = []
    # Also the embedding tables (Gather on a constant table -> GatherBlockQuantized, 4 bits, RTN):
    # most of a small transformer's bytes.
    embeddings: bool = False

    @field_validator("block_size")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError("block_size must be a power of two (16, 32, 64, 128, ...): MatMulNBits needs it")
        return value

    @model_validator(mode="after")
    def _supported(self) -> WeightOnlyConfig:
        if self.algorithm == "hqq" and self.bits != 4:
            raise ValueError(
                "algorithm 'hqq' writes 4 bits only (onnxruntime's CPU MatMulNBits refuses its 8-bit form)"
            )
        if self.embeddings and (self.algorithm != "rtn" or self.bits != 4):
            raise ValueError("embeddings: onnxruntime quantizes Gather tables with rtn at 4 bits only")
        return self


@register_pass
class WeightOnlyQuantization(Pass):
    """Blockwise 4/8-bit weights for MatMuls with constant weights (``MatMulNBits``)."""

    name = "weight_only"
    role = "quantize"
    knobs = Knobs(exclude="nodes_to_exclude")
    quantizes = "dynamic"
    leaves_quantized = frozenset({"MatMulNBits", "GatherBlockQuantized"})
    rewrites_weights = True
    restructuring = True  # MatMul -> MatMulNBits
    auto_place = "weights"
    Config = WeightOnlyConfig
    providers = ("CPUExecutionProvider", "CUDAExecutionProvider", "DmlExecutionProvider", "WebGpuExecutionProvider")
    # Priors: 4 bits is the point of the pass; small blocks hold accuracy best. HQQ is not in the
    # default search: it takes far longer than RTN for about the same accuracy.
    search_space = {
        "bits": Categorical((4, 8), weights=(2, 1)),
        "block_size": Categorical((32, 64, 128), weights=(2, 1, 1)),
        "accuracy_level": Categorical((4, 0), weights=(2, 1)),
        "symmetric": Conditional.on("algorithm", {"rtn": (True, False)}),
        "embeddings": Conditional.on("bits", {4: (False, True)}),
    }
    min_opset = 0  # MatMulNBits is a com.microsoft op
    graph_params = frozenset({"bits", "block_size", "accuracy_level", "nodes_to_exclude", "embeddings"})

    @classmethod
    def accepts(cls, config: PassConfig, upstream: list[tuple[str, PassConfig]]) -> bool:
        """Not after a pass that rewrote the weights: no float32 MatMul weights are left."""
        return not weights_rewritten(upstream)

    @classmethod
    def supports(cls, config: PassConfig, facts: Mapping[str, Any], upstream: list[tuple[str, PassConfig]]) -> bool:
        assert isinstance(config, WeightOnlyConfig)
        return blocks_fit(config.block_size, config.nodes_to_exclude, facts, upstream)

    def run(self, config: WeightOnlyConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        if config.algorithm == "hqq" and not HQQ_AVAILABLE:
            raise TrialError("weight_only algorithm 'hqq' needs torch: pip install 'quantune[hqq]'")

        def algorithm(nbits: Any) -> Any:
            if config.algorithm == "hqq":
                return nbits.HQQWeightOnlyQuantConfig(block_size=config.block_size, bits=config.bits)
            return nbits.DefaultWeightOnlyQuantConfig(
                block_size=config.block_size,
                is_symmetric=config.symmetric,
                accuracy_level=config.accuracy_level or None,
                bits=config.bits,
                op_types_to_quantize=("MatMul", "Gather") if config.embeddings else ("MatMul",),
            )

        out = quantize_nbits(self.name, model_in, config.nodes_to_exclude, algorithm)
        packed = [node for node in out.graph.node if node.op_type == "MatMulNBits"]
        if not packed and not any(node.op_type == "GatherBlockQuantized" for node in out.graph.node):
            raise TrialError("weight_only: no MatMul has a constant weight to quantize (nothing changed)")
        if config.accuracy_level:  # HQQ does not set it; RTN already did
            for node in packed:
                existing = [a for a in node.attribute if a.name == "accuracy_level"]
                if existing:
                    existing[0].i = config.accuracy_level
                else:
                    node.attribute.append(onnx.helper.make_attribute("accuracy_level", config.accuracy_level))
        save_model(out, model_out)


def blocks_fit(
    block_size: int, nodes_to_exclude: list[str], facts: Mapping[str, Any], upstream: list[tuple[str, PassConfig]]
) -> bool:
    """Whether an unexcluded constant MatMul weight exists, with half of ``block_size`` below its largest K."""
    if not facts_apply(facts, upstream) or "matmul_weights" not in facts:
        return True
    excluded = set(nodes_to_exclude)
    depths = [k for name, k, _ in facts["matmul_weights"] if not name or name not in excluded]
    return bool(depths) and (block_size == 16 or block_size // 2 < max(depths))


def quantize_nbits(
    name: str, model_in: Path, nodes_to_exclude: list[str], algorithm: Callable[[Any], Any]
) -> onnx.ModelProto:
    """onnxruntime's ``MatMulNBitsQuantizer`` on ``model_in`` with ``algorithm(its module)``."""
    try:
        from onnxruntime.quantization import matmul_nbits_quantizer as nbits
    except ImportError as exc:  # onnx_ir is a dependency of onnxruntime's quantizer since 1.2x
        raise TrialError(f"{name} needs onnxruntime's MatMulNBits quantizer: {exc} (pip install onnx-ir)") from exc
    quiet = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # it logs a line per node at INFO
    try:
        quantizer = nbits.MatMulNBitsQuantizer(
            onnx.load(str(model_in)), nodes_to_exclude=list(nodes_to_exclude), algo_config=algorithm(nbits)
        )
        quantizer.process()
    finally:
        quiet.setLevel(level)
    return quantizer.model.model


def save_model(model: onnx.ModelProto, path: Path) -> None:
    """One file, or the weights in ``<name>.data`` beside it past protobuf's 2 GB limit."""
    large = model.ByteSize() > 2**31 - 2**26
    onnx.save(model, str(path), save_as_external_data=large, location=f"{path.name}.data" if large else None)
