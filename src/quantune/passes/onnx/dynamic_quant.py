"""onnxruntime dynamic quantization: int8 weights, activation ranges computed at run time.

What each op type gets follows Neural Compressor's dynamic defaults, which hold accuracy budgets
that onnxruntime's plain settings miss: MatMul (and Gemm, rewritten to MatMul + Add) per output
column with ``per_channel``; LSTM and Attention per direction / tensor in a call of their own;
Conv per tensor; embedding Gathers int8 symmetric per tensor (:mod:`.gather_int8`). The weights
equal Neural Compressor's byte for byte (``bench/nc_equal.py``). A call is made only for a group
the model has a node of (an empty op-type list would mean "all" to onnxruntime). A model without
external data is built in memory (:mod:`.fast_shapes`), to the same bytes.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import onnx
from onnxruntime.quantization import quantize_dynamic
from onnxruntime.quantization.registry import IntegerOpsRegistry

from quantune.model import external_data_files, graphs
from quantune.passes.base import Knobs, Pass, PassConfig, PassContext
from quantune.passes.onnx.compat import quantizer_accepts
from quantune.passes.onnx.fast_channels import fast_per_channel
from quantune.passes.onnx.fast_lookups import fast_lookups
from quantune.passes.onnx.fast_shapes import ModelStore, fits_in_memory, in_memory_shapes
from quantune.passes.onnx.gather_int8 import quantize_gathers
from quantune.passes.onnx.pre_optimize import drop_types, drop_value_infos, optimize_extended, optimize_extended_model
from quantune.passes.onnx.static_quant import QUANT_TYPES
from quantune.passes.onnx.weight_only import save_model
from quantune.passes.registry import facts_apply, register_pass
from quantune.prepare.facts import quantized_among
from quantune.space import Boolean, Categorical

# Op types whose integer kernel is fast with uint8 weights only: "mixed" gives them uint8 weights.
UINT8_FAST = ("Conv",)
# Op types that stay per tensor (per direction) under per_channel, as in Neural Compressor.
PER_TENSOR = ("LSTM", "Attention")
# save_model's threshold for writing the weights beside the model (weight_only.py)
LARGE_MODEL = 2**31 - 2**26
# Op types quantized only when their input already is: never worth a call of their own.
FOLLOWERS = ("Transpose",)


class DynamicQuantizationConfig(PassConfig):
    # "mixed": uint8 weights for convolutions (ConvInteger is fast with those only), int8 for the rest;
    # with int8 weights (int8, mixed) embedding Gathers get int8 symmetric per-tensor tables
    weight_type: Literal["int8", "uint8", "mixed"] = "int8"
    # per output column for MatMul/Gemm weights only
    per_channel: bool = False
    reduce_range: bool = False
    op_types_to_quantize: list[str] | None = None
    nodes_to_exclude: list[str] = []
    # "extended": onnxruntime's extended graph optimization first (fused LayerNorm, Gelu, ...)
    pre_optimize: Literal["none", "extended"] = "none"


@register_pass
class DynamicQuantization(Pass):
    """Quantizes weights ahead of time and activations on the fly (no calibration data)."""

    name = "dynamic_quant"
    role = "quantize"
    quantizes = "dynamic"
    leaves_quantized = frozenset({"MatMulInteger", "ConvInteger", "DynamicQuantizeLSTM", "QAttention"})
    rewrites_weights = True
    auto_place = "quantize"
    Config = DynamicQuantizationConfig
    limits = "needs the weights of the convolutions it quantizes as initializers"
    graph_params = frozenset({"weight_type", "per_channel", "op_types_to_quantize", "nodes_to_exclude", "pre_optimize"})
    knobs = Knobs(
        exclude="nodes_to_exclude",
        op_types="op_types_to_quantize",
        weights="weight_type",
        per_channel="per_channel",
        narrow="reduce_range",
        screen=("per_channel", "reduce_range"),
        ceilings=("pre_optimize", "weight_type"),
        speed_class=("weight_type", "pre_optimize"),
    )
    providers = ("CPUExecutionProvider",)
    search_space = {
        "weight_type": Categorical(("int8", "mixed")),
        "per_channel": Boolean(),
        "reduce_range": Boolean(),
        "pre_optimize": Categorical(("none", "extended")),
    }

    version = 2
    min_opset = 11  # DynamicQuantizeLinear's

    @classmethod
    def needs_symbolic_shapes(cls, values: Mapping[str, Any]) -> bool:
        return values.get("pre_optimize") == "extended"

    @classmethod
    def fastest(cls, op_types: frozenset[str]) -> dict[str, Any]:
        return {"weight_type": "mixed" if "Conv" in op_types else "int8", "pre_optimize": "extended"}

    @classmethod
    def ceiling_values(cls, param: str, values: list[Any], op_types: frozenset[str]) -> list[Any]:
        if param == "weight_type" and "Conv" not in op_types and "int8" in values:
            return [value for value in values if value != "mixed"]
        return values

    @classmethod
    def faster_twin(
        cls, config: Mapping[str, Any], provider: str, op_types: frozenset[str]
    ) -> tuple[dict[str, Any], str] | None:
        quantized = set(config.get("op_types_to_quantize") or op_types) & op_types
        if config.get("weight_type") == "int8" and quantized & set(UINT8_FAST):
            return {"weight_type": "mixed"}, "onnxruntime's ConvInteger is fast with uint8 weights only"
        return None

    @classmethod
    def supports(cls, config: PassConfig, facts: Mapping[str, Any], upstream: list[tuple[str, PassConfig]]) -> bool:
        assert isinstance(config, DynamicQuantizationConfig)
        if not facts_apply(facts, upstream):
            return True
        return not quantized_among(
            facts.get("computed_weights", ()), config.op_types_to_quantize, config.nodes_to_exclude
        )

    @classmethod
    def accepts(cls, config: PassConfig, upstream: list[tuple[str, PassConfig]]) -> bool:
        """Not after graph_opt 'all': its NCHWc layout ops have no quantized form onnxruntime loads."""
        if not quantizer_accepts(cls.name, config, upstream):
            return False
        return not any(name == "graph_opt" and getattr(c, "level", None) in ("all",) for name, c in upstream)

    def run(self, config: DynamicQuantizationConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        if fits_in_memory(model_in):
            self._run_in_memory(config, model_in, model_out)
            return
        with tempfile.TemporaryDirectory(dir=model_out.parent) as scratch:
            added: list[str] = []
            if config.pre_optimize == "extended":
                optimized = Path(scratch) / "extended.onnx"
                added = optimize_extended(model_in, optimized)
                model_in = optimized
            unweighted = onnx.load(str(model_in), load_external_data=False)
            calls = plan_calls(config, present_op_types(unweighted, config.nodes_to_exclude))
            del unweighted  # a large model's weights are not held through the quantizer's calls
            for step, (weight_type, per_channel, op_types) in enumerate(calls):
                out = model_out if step == len(calls) - 1 else Path(scratch) / f"step{step}.onnx"
                self._quantize(config, model_in, out, weight_type, op_types, per_channel)
                model_in = out
            if not calls:  # nothing for onnxruntime (the Gathers alone, or every node excluded)
                _copy_model(model_in, model_out)
            if int8_gathers(config):
                model = onnx.load(str(model_out))
                if quantize_gathers(model, config.nodes_to_exclude, reduce_range=config.reduce_range):
                    save_model(model, model_out)
            drop_types(model_out, added)

    def _run_in_memory(self, config: DynamicQuantizationConfig, model_in: Path, model_out: Path) -> None:
        """:meth:`run`'s steps with the models between them in memory: the same bytes, fewer files."""
        store = ModelStore()
        with tempfile.TemporaryDirectory(dir=model_out.parent) as scratch:
            added: list[str] = []
            if config.pre_optimize == "extended":
                optimized = Path(scratch) / "extended.onnx"
                model, added = optimize_extended_model(model_in, optimized)
                model_in = optimized
            else:
                model = onnx.load(str(model_in))
            calls = plan_calls(config, present_op_types(model, config.nodes_to_exclude))
            store.put(model_in, model)
            for step, (weight_type, per_channel, op_types) in enumerate(calls):
                out = model_out if step == len(calls) - 1 else Path(scratch) / f"step{step}.onnx"
                store.expect(out)
                self._quantize(config, model_in, out, weight_type, op_types, per_channel, store)
                model_in = out
            result = store.take(model_in)
            if result is None:  # the quantizer wrote the file itself
                result = onnx.load(str(model_in))
            changed = bool(
                int8_gathers(config)
                and quantize_gathers(result, config.nodes_to_exclude, reduce_range=config.reduce_range)
            )
            changed = drop_value_infos(result, added) or changed
            if calls or changed:
                _write(result, model_out)
            else:  # the input (or onnxruntime's optimized model) as it is, byte for byte
                _copy_model(model_in, model_out)

    def _quantize(
        self,
        config: DynamicQuantizationConfig,
        model_in: Path,
        model_out: Path,
        weight_type: str,
        op_types: list[str],
        per_channel: bool,
        store: ModelStore | None = None,
    ) -> None:
        in_memory = in_memory_shapes(store) if store is not None else contextlib.nullcontext()
        with fast_per_channel(), fast_lookups(), in_memory:  # all channels at once (fast_channels.py), no full scans
            quantize_dynamic(
                str(model_in),
                str(model_out),
                weight_type=QUANT_TYPES[weight_type],
                per_channel=per_channel,
                reduce_range=config.reduce_range,
                op_types_to_quantize=op_types,
                nodes_to_exclude=excluded_names(config.nodes_to_exclude),
                # fused com.microsoft ops have no inferred types: the quantizer falls back to this
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )


def int8_gathers(config: DynamicQuantizationConfig) -> bool:
    """Whether embedding Gathers get gather_int8's tables (int8 weights, Gather among the op types)."""
    allowed = not config.op_types_to_quantize or "Gather" in config.op_types_to_quantize  # [] means all
    return config.weight_type in ("int8", "mixed") and allowed


def plan_calls(config: DynamicQuantizationConfig, present: set[str]) -> list[tuple[str, bool, list[str]]]:
    """The onnxruntime calls, in order: (weight type, per_channel, op types) with a node in ``present``."""
    allowed = list(config.op_types_to_quantize or IntegerOpsRegistry)
    if int8_gathers(config):
        allowed = [t for t in allowed if t != "Gather"]  # gather_int8 quantizes them
    groups: list[tuple[str, bool, list[str]]] = []
    rest = allowed
    if config.weight_type == "mixed":
        groups.append(("uint8", False, _among(allowed, UINT8_FAST)))
        rest = [t for t in allowed if t not in UINT8_FAST]
    weight_type = "int8" if config.weight_type == "mixed" else config.weight_type
    if config.per_channel:
        groups.append((weight_type, True, [t for t in rest if t not in PER_TENSOR]))
        groups.append((weight_type, False, _among(rest, PER_TENSOR)))
    else:
        groups.append((weight_type, False, rest))
    return [group for group in groups if any(t in present and t not in FOLLOWERS for t in group[2])]


def present_op_types(model: onnx.ModelProto, nodes_to_exclude: list[str]) -> set[str]:
    """Op types of the nodes not excluded (subgraphs included; a Gemm counts as a MatMul: it becomes one)."""
    excluded = set(nodes_to_exclude)
    present = {n.op_type for g in graphs(model.graph) for n in g.node if not n.name or n.name not in excluded}
    return present | {"MatMul"} if "Gemm" in present else present


def excluded_names(nodes_to_exclude: list[str]) -> list[str]:
    """``nodes_to_exclude`` and ``<name>_MatMul`` for each: onnxruntime rewrites a Gemm into those
    before it reads the exclusions, so without it an excluded Gemm would be quantized."""
    names = list(nodes_to_exclude)
    return names + [f"{name}_MatMul" for name in names if f"{name}_MatMul" not in names]


def _copy_model(model_in: Path, model_out: Path) -> None:
    """The model as it is, its external data (if any) beside the copy."""
    if external_data_files(model_in):
        save_model(onnx.load(str(model_in)), model_out)
    else:
        shutil.copyfile(model_in, model_out)


def _write(model: onnx.ModelProto, path: Path) -> None:
    """:func:`save_model`'s bytes, serialized once (save_model asks the size first)."""
    try:
        data = model.SerializeToString()
    except ValueError:  # past protobuf's limit
        data = b""
    if not data or len(data) > LARGE_MODEL:
        save_model(model, path)
        return
    path.write_bytes(data)


def _among(op_types: list[str], wanted: tuple[str, ...]) -> list[str]:
    return [t for t in op_types if t in wanted]
