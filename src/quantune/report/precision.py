"""Which precision each compute op of the chosen model runs in, and why a fallen one stayed float.

The precision is read from the produced model itself, not from what the trial asked for; the
reason comes from the run's own records (the excluded nodes, the group's sensitivity, and the
closest finished trial that quantized it and missed the budget).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantune.engine.outcome.result import Result
from quantune.engine.trials.trial import TrialRecord
from quantune.evaluate.quantized import FLOAT_COMPUTE_OPS, QUANTIZED_COMPUTE_OPS
from quantune.passes import Knobs, knob_names
from quantune.report.spec import Spec, bar, titled

_NAMES = {
    1: "fp32",
    10: "fp16",
    16: "bf16",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    21: "uint4",
    22: "int4",
}
_DYNAMIC = {"MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLSTM"}
# Stages in which accuracy-driven strategies recover accuracy (the rest search speed).
RECOVERY_PREFIXES = (
    "recover",
    "recipes",
    "screen",
    "op types",
    "bisect",
    "prune",
    "op-type-wise",
    "block-wise",
    "instance-wise",
    "quantize ",
    "fallback",
    "revert",
)


@dataclass
class OpPrecision:
    name: str  # the node's name in the chosen model
    op_type: str
    precision: str  # int8, uint8, int16, int4, fp32, fp16, ...
    detail: str = ""  # e.g. "activations uint8, weights int8 (dynamic)"
    original: str = ""  # the original node's name (QOperator ops are renamed ..._quant)


@dataclass
class Fallback:
    node: str
    precision: str  # fp32, or int16 for tensor overrides
    group: str | None = None
    score: float | None = None
    rank: int | None = None
    groups_ranked: int | None = None
    evidence: dict[str, Any] | None = None  # the trial that showed it was needed
    nodes: list[str] = field(default_factory=list)


def op_precisions(model_path: str | Path) -> list[OpPrecision]:
    """Every compute op of the model (main graph), in graph order, with its precision."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    graph = model.graph
    inits = {t.name: t.data_type for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    out = []
    for node in graph.node:
        if node.op_type in QUANTIZED_COMPUTE_OPS:
            out.append(_quantized(node, inits, producers))
        elif node.op_type in FLOAT_COMPUTE_OPS:
            out.append(_float(node, inits, producers))
    return out


def _dtype(name: str, inits: Mapping[str, int]) -> str | None:
    code = inits.get(name)
    return None if code is None else _NAMES.get(code, f"type {code}")


def _quantized(node: Any, inits: Mapping[str, int], producers: Mapping[str, Any]) -> OpPrecision:
    inputs = list(node.input)
    original = node.name[: -len("_quant")] if node.name.endswith("_quant") else node.name
    if node.op_type in ("MatMulNBits", "MatMulBnb4", "GatherBlockQuantized"):
        bits = next((a.i for a in node.attribute if a.name == "bits"), 4)
        return OpPrecision(node.name, node.op_type, f"int{bits}", "weight-only", original)
    if node.op_type in _DYNAMIC:
        weight = _dtype(inputs[1], inits) if len(inputs) > 1 else None
        source = producers.get(inputs[0]) if inputs else None
        act = "uint8" if source is not None and source.op_type == "DynamicQuantizeLinear" else None
        precision = weight or act or "int8"
        return OpPrecision(node.name, node.op_type, precision, _detail(act, weight, "dynamic"), original)
    # QLinearConv / QLinearMatMul / QGemm: x, x_scale, x_zero_point, w, ...
    act = _dtype(inputs[2], inits) if len(inputs) > 2 else None
    weight = _dtype(inputs[3], inits) if len(inputs) > 3 else None
    return OpPrecision(node.name, node.op_type, act or weight or "int8", _detail(act, weight), original)


def _float(node: Any, inits: Mapping[str, int], producers: Mapping[str, Any]) -> OpPrecision:
    inputs = list(node.input)
    data = producers.get(inputs[0]) if inputs else None
    weight_node = producers.get(inputs[1]) if len(inputs) > 1 else None
    if data is not None and data.op_type == "DequantizeLinear":
        act = _dq_type(data, inits, producers)
        weight = _dq_type(weight_node, inits, producers) if _is_dq(weight_node) else None
        if weight is not None:  # onnxruntime fuses DQ -> op <- DQ into an integer kernel
            return OpPrecision(node.name, node.op_type, act, _detail(act, weight, "QDQ"), node.name)
    if _is_dq(weight_node):
        weight = _dq_type(weight_node, inits, producers)
        return OpPrecision(
            node.name, node.op_type, "fp32", f"weights {weight}, dequantized: computes in float", node.name
        )
    weight = _dtype(inputs[1], inits) if len(inputs) > 1 else None
    if weight is None and weight_node is not None and weight_node.op_type == "Cast":
        weight = next((_NAMES.get(a.i) for a in weight_node.attribute if a.name == "to"), None)
    return OpPrecision(node.name, node.op_type, weight if weight in ("fp16", "bf16") else "fp32", "", node.name)


def _is_dq(node: Any) -> bool:
    return node is not None and node.op_type == "DequantizeLinear"


def _dq_type(node: Any, inits: Mapping[str, int], producers: Mapping[str, Any]) -> str:
    """The integer type a DequantizeLinear reads: its input's (a weight), its zero point's, or the
    zero point of the QuantizeLinear that feeds it; uint8 (ONNX's default) otherwise."""
    inputs = list(node.input)
    found = _dtype(inputs[0], inits) or (_dtype(inputs[2], inits) if len(inputs) > 2 else None)
    if found is None and (source := producers.get(inputs[0])) is not None and source.op_type == "QuantizeLinear":
        q_inputs = list(source.input)
        found = _dtype(q_inputs[2], inits) if len(q_inputs) > 2 else None
    return found or "uint8"


def _detail(act: str | None, weight: str | None, kind: str = "") -> str:
    parts = [f"activations {act}" if act else "", f"weights {weight}" if weight else ""]
    text = ", ".join(p for p in parts if p)
    return f"{text} ({kind})" if kind and text else text or kind


def precision_counts(ops: Iterable[OpPrecision]) -> dict[str, dict[str, int]]:
    """Op type (float name: QLinearConv counts as Conv) -> precision -> count."""
    counts: dict[str, dict[str, int]] = {}
    for op in ops:
        kind = _float_type(op.op_type)
        counts.setdefault(kind, {})
        counts[kind][op.precision] = counts[kind].get(op.precision, 0) + 1
    return counts


def _float_type(op_type: str) -> str:
    for prefix in ("QLinear", "DynamicQuantize", "Q"):
        if op_type.startswith(prefix) and op_type[len(prefix) :] in FLOAT_COMPUTE_OPS:
            return op_type[len(prefix) :]
    for suffix in ("Integer", "IntegerToFloat", "NBits", "Bnb4"):
        if op_type.endswith(suffix) and op_type[: -len(suffix)] in FLOAT_COMPUTE_OPS:
            return op_type[: -len(suffix)]
    return op_type


def plays(key: str, *roles: Callable[[Knobs], str | None]) -> bool:
    """Whether a trial's parameter ``key`` (``step.name``) is one a pass's knobs give one of ``roles``."""
    return any(key.split(".", 1)[-1] in knob_names(role) for role in roles)


def excluded(params: Mapping[str, Any]) -> list[str]:
    """The node names a trial's params keep in fp32 (every step's nodes to exclude)."""
    names: list[str] = []
    for key, value in params.items():
        if plays(key, lambda knobs: knobs.exclude) and isinstance(value, list | tuple):
            names.extend(str(v) for v in value)
    return names


def overridden(params: Mapping[str, Any]) -> list[str]:
    """Tensors a trial's params give another precision (tensor overrides: int16 fallbacks)."""
    names: list[str] = []
    for key, value in params.items():
        if plays(key, lambda knobs: knobs.overrides) and isinstance(value, dict):
            names.extend(str(k) for k in value)
    return names


def fallbacks(results: Result, chosen: TrialRecord) -> list[Fallback]:
    """Each node the chosen trial keeps in fp32 with its group, sensitivity and evidence."""
    kept = excluded(chosen.params)
    groups = _groups(results, chosen)
    ranked = sorted(groups.items(), key=lambda item: -_score(item[1]))
    ranks = {name: index + 1 for index, (name, _) in enumerate(ranked)}
    node_group = {node: name for name, entry in groups.items() for node in entry.get("nodes", [])}
    out = []
    for node in kept:
        group = node_group.get(node)
        entry = groups.get(group or "", {})
        out.append(
            Fallback(
                node=node,
                precision="fp32",
                group=group,
                score=entry.get("score"),
                rank=ranks.get(group or ""),
                groups_ranked=len(ranks) or None,
                evidence=evidence(results, chosen, node),
                nodes=list(entry.get("nodes", [])),
            )
        )
    return out


def _groups(results: Result, chosen: TrialRecord) -> dict[str, dict[str, Any]]:
    """The sensitivity entries of the chosen trial's flow (all flows' when it does not say)."""
    sensitivity = (results.strategy_notes or {}).get("sensitivity") or {}
    flow = chosen.params.get("flow")
    if flow in sensitivity:
        return dict(sensitivity[flow])
    merged: dict[str, dict[str, Any]] = {}
    for entries in sensitivity.values():
        merged.update(entries)
    return merged


def evidence(results: Result, chosen: TrialRecord, node: str) -> dict[str, Any] | None:
    """The finished trial of the chosen flow that quantized ``node`` and missed the budget, with
    the fewest other differences from the chosen trial's fallback (the latest on a tie)."""
    target = set(excluded(chosen.params)) - {node}
    flow = chosen.flow
    variant = _variant(chosen.params)
    best: tuple[int, int, int] | None = None
    found = None
    for trial in results.trials:
        if trial.status != "ok" or trial.meets_criterion is not False or trial.flow != flow:
            continue
        fallen = set(excluded(trial.params))
        if node in fallen:
            continue
        # the same quantization settings first, then the fewest other fallback differences, then the latest
        key = (int(_variant(trial.params) != variant), len(fallen ^ target), -trial.number)
        if best is None or key < best:
            best, found = key, trial
    if found is None:
        return None
    return {
        "number": found.number,
        "stage": found.stage,
        "accuracy_loss": found.accuracy_loss,
        "other_differences": best[1] if best else 0,
        "same_settings": best[0] == 0 if best else False,
    }


def recovered(results: Result, chosen: TrialRecord) -> tuple[str, dict[str, str]]:
    """What the refining passes kept in int8 in the chosen trial: a sentence for the whole model and
    node -> how, for the units the fallback had put in fp32."""
    notes = (results.strategy_notes or {}).get("recovered") or {}
    flow = (chosen.params or {}).get("flow")
    if not notes or (flow is not None and flow != notes.get("flow")):
        return "", {}
    how = " + ".join(notes.get("passes", [])) or "refining passes"
    units = notes.get("units")
    if units == "all":
        return f"every unit kept in int8: {how} held the budget before any fallback (recover stage)", {}
    groups = _groups(results, chosen)
    before = bool(notes.get("before_fallback"))  # the targeted stage's fix of the worst units
    when = "the worst unit(s) by sensitivity" if before else "back to int8 after the fallback"
    by_node: dict[str, str] = {}
    for unit in units or []:
        fix = (notes.get("how") or {}).get(unit, how)
        for node in groups.get(unit, {}).get("nodes", [unit]):
            by_node[node] = f"recovered by {fix}: {when}, held the budget in int8 (recover stage)"
    if before:
        text = f"{len(units or [])} unit(s) kept in int8 by {how} on just those layers, before any fallback"
    else:
        text = f"{len(units or [])} unit(s) the fallback had put in fp32 kept in int8 by {how} (recover stage)"
    return (text if units else ""), by_node


def _variant(params: Mapping[str, Any]) -> str:
    """A trial's settings other than its fallback, as one comparable key."""
    rest = {k: v for k, v in params.items() if not plays(k, lambda knobs: knobs.exclude, lambda knobs: knobs.overrides)}
    return repr(sorted(rest.items(), key=lambda kv: kv[0]))


def recovery_steps(results: Result) -> list[TrialRecord]:
    """The trials of accuracy-recovering stages (screen, op types, bisect, prune, ...), in order."""
    return [t for t in sorted(results.trials, key=lambda t: t.number) if str(t.stage).startswith(RECOVERY_PREFIXES)]


def _score(entry: Mapping[str, Any]) -> float:
    """A group's score for ranking; a broken (null) measurement ranks first, as the strategy ranked it."""
    score = entry.get("score")
    return float("inf") if score is None else float(score)


def precision_bars(counts: Mapping[str, Mapping[str, int]]) -> Spec:
    """Compute ops per op type, stacked by precision (``counts``: op type -> precision -> n)."""
    order = ["int4", "int8", "uint8", "int16", "uint16", "fp16", "bf16", "fp32", "other"]
    colors = {"int4": "#084081", "int8": "#0868ac", "uint8": "#2b8cbe", "int16": "#7bccc4", "uint16": "#a8ddb5"}
    colors.update({"fp16": "#fdae6b", "bf16": "#fd8d3c", "fp32": "#e6550d", "other": "#9a9a9a"})
    types = list(counts)
    seen = {p for c in counts.values() for p in c}
    figure = Spec()
    for precision in [p for p in order if p in seen] + sorted(seen - set(order)):
        figure.add_trace(
            bar(
                y=types,
                x=[counts[t].get(precision, 0) for t in types],
                name=precision,
                orientation="h",
                marker={"color": colors.get(precision, "#9a9a9a")},
            )
        )
    figure.update_layout(barmode="stack", title={"text": "compute ops by precision"}, xaxis=titled("ops"))
    from quantune.report.plots import styled

    return styled(figure, height=max(260, 60 + 28 * len(types)))
