"""Weight-only quantization: MatMul weights to 4 (or 8) bits in blocks, onnxruntime's ``MatMulNBits``.

This is how transformer and LLM weights are shrunk in ONNX: activations stay float, each
constant MatMul weight is stored as 4-bit (or 8-bit) integers with one scale (and zero point)
per ``block_size`` rows of a column, and onnxruntime's ``MatMulNBits`` kernel dequantizes on
the fly. ``accuracy_level`` picks the kernel's compute type (0: unset, 1: fp32, 2: fp16,
3: bf16, 4: int8 -- the int8 kernels are the fast ones on x86/ARM CPUs).

Algorithms, both without Neural Compressor: ``rtn`` (round to nearest, onnxruntime's
``DefaultWeightOnlyQuantConfig``) and ``hqq`` (half-quadratic quantization,
``HQQWeightOnlyQuantConfig``: 4 bits only, asymmetric by construction, needs torch:
``pip install 'quantune[hqq]'``). GPTQ is left out: onnxruntime runs it through its copy of
Neural Compressor's code, which fails for RTN already.

``nodes_to_exclude`` keeps MatMuls in float (searchable with ``subset_of: {op_types: [MatMul]}``);
a later ``dynamic_quant`` step may still make those int8.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping
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
    # MatMulNBits has CPU, CUDA, DirectML and WebGPU kernels; not the QDQ-only accelerators.
    providers = ("CPUExecutionProvider", "CUDAExecutionProvider", "DmlExecutionProvider", "WebGpuExecutionProvider")
    # Priors: 4 bits is the point of the pass (8 bits keeps accuracy where 4 loses it); int8
    # compute (accuracy_level 4) is the fast CPU kernel; small blocks hold accuracy best.
    # HQQ is not in the default search: it takes far longer than RTN for about the same
    # accuracy; name it (``algorithm: {search: [rtn, hqq]}``) to try it.
    search_space = {
        "bits": Categorical((4, 8), weights=(2, 1)),
        "block_size": Categorical((32, 64, 128), weights=(2, 1, 1)),
        "accuracy_level": Categorical((4, 0), weights=(2, 1)),
        "symmetric": Conditional.on("algorithm", {"rtn": (True, False)}),
        "embeddings": Conditional.on("bits", {4: (False, True)}),
    }
    # MatMulNBits is a com.microsoft op; the quantizer raises what it needs itself.
    min_opset = 0
    # Parameters that change the executed graph or its kernels (see StaticQuantization.graph_params);
    # symmetric and algorithm only move the weights' values.
    graph_params = frozenset({"bits", "block_size", "accuracy_level", "nodes_to_exclude", "embeddings"})

    @classmethod
    def accepts(cls, config: PassConfig, upstream: list[tuple[str, PassConfig]]) -> bool:
        """Not after a quantizer or fp16: their MatMul weights are no longer float32 initializers
        (MatMulInteger, QDQ pairs, fp16 tensors), so there is nothing left to quantize."""
        return not weights_rewritten(upstream)

    @classmethod
    def supports(cls, config: PassConfig, facts: Mapping[str, Any], upstream: list[tuple[str, PassConfig]]) -> bool:
        """The model needs a MatMul with a constant weight that is not excluded (else the pass
        changes nothing), and a ``block_size`` whose half is below the largest such K (a larger
        block is one padded block per column, the same model as the next smaller size)."""
        assert isinstance(config, WeightOnlyConfig)
        if not facts_apply(facts, upstream) or "matmul_weights" not in facts:
            return True
        excluded = set(config.nodes_to_exclude)
        depths = [k for name, k, _ in facts["matmul_weights"] if not name or name not in excluded]
        if not depths:
            return False
        return config.block_size == 16 or config.block_size // 2 < max(depths)

    def run(self, config: WeightOnlyConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        try:
            from onnxruntime.quantization import matmul_nbits_quantizer as nbits
        except ImportError as exc:  # onnx_ir is a dependency of onnxruntime's quantizer since 1.2x
            raise TrialError(
                f"weight_only needs onnxruntime's MatMulNBits quantizer: {exc} (pip install onnx-ir)"
            ) from exc
        if config.algorithm == "hqq":
            if not HQQ_AVAILABLE:
                raise TrialError("weight_only algorithm 'hqq' needs torch: pip install 'quantune[hqq]'")
            algo: Any = nbits.HQQWeightOnlyQuantConfig(block_size=config.block_size, bits=config.bits)
        else:
            algo = nbits.DefaultWeightOnlyQuantConfig(
                block_size=config.block_size,
                is_symmetric=config.symmetric,
                accuracy_level=config.accuracy_level or None,
                bits=config.bits,
                op_types_to_quantize=("MatMul", "Gather") if config.embeddings else ("MatMul",),
            )
        model = onnx.load(str(model_in))
        quiet = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
        level = quiet.level
        quiet.setLevel(logging.WARNING)  # it logs a line per node at INFO
        try:
            quantizer = nbits.MatMulNBitsQuantizer(
                model, nodes_to_exclude=list(config.nodes_to_exclude), algo_config=algo
            )
            quantizer.process()
        finally:
            quiet.setLevel(level)
        out = quantizer.model.model
        packed = [node for node in out.graph.node if node.op_type == "MatMulNBits"]
        if not packed and not any(node.op_type == "GatherBlockQuantized" for node in out.graph.node):
            raise TrialError("weight_only: no MatMul has a constant weight to quantize (nothing changed)")
        if config.accuracy_level:  # HQQ does not set it; RTN already did
            for node in packed:
                _set_int_attribute(node, "accuracy_level", config.accuracy_level)
        save_model(out, model_out)


def save_model(model: onnx.ModelProto, path: Path) -> None:
    """One file, or the weights in ``<name>.data`` beside it past protobuf's 2 GB limit."""
    large = model.ByteSize() > 2**31 - 2**26
    onnx.save(model, str(path), save_as_external_data=large, location=f"{path.name}.data" if large else None)


def _set_int_attribute(node: onnx.NodeProto, name: str, value: int) -> None:
    for attribute in node.attribute:
        if attribute.name == name:
            attribute.i = value
            return
    node.attribute.append(onnx.helper.make_attribute(name, value))
