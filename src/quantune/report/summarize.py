"""Long parameter values said in a few words for the console: "37 nodes excluded: 12 Add, 9 Mul, ...".

The full lists stay in ``results.json`` and the HTML report; the console would be thousands of lines.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SHOWN_ITEMS = 3  # a list or mapping this short is printed as it is
SHOWN_TYPES = 3  # op types named in a summary; the rest are counted


def quantized_label(metrics: Mapping[str, Any]) -> str:
    """Quantized compute ops and their share of the model's: "3 (100%)", or "none"."""
    if "quantized_ops" not in metrics:
        return ""
    if not metrics["quantized_ops"]:
        return "none"
    return f"{metrics['quantized_ops']:.0f} ({metrics.get('quantized_compute_fraction', 0.0):.0%})"


def node_op_types(model_path: str | Path | None) -> dict[str, str]:
    """Node name -> op type of the model trials start from ({} when it cannot be read)."""
    if not model_path:
        return {}
    try:
        import onnx

        model = onnx.load(str(model_path), load_external_data=False)
    except Exception:  # a cache entry pruned since: the counts stay, the op types go
        return {}
    return {node.name: node.op_type for node in model.graph.node if node.name}


def summarize_value(name: str, value: Any, op_types: dict[str, str] | None = None) -> str | None:
    """A short text for a long list or mapping parameter, or None when it is short enough as it is."""
    if not isinstance(value, (list, tuple, dict)) or len(value) <= SHOWN_ITEMS:
        return None
    count = len(value)
    if "node" in name and isinstance(value, (list, tuple)):
        verb = " excluded" if "exclude" in name else f" ({name})"
        types = Counter((op_types or {}).get(str(item), "") for item in value)
        known = [(op, n) for op, n in types.most_common() if op]
        if not known:
            return f"{count} nodes{verb}"
        parts = [f"{n} {op}" for op, n in known[:SHOWN_TYPES]]
        rest = sum(n for _, n in known[SHOWN_TYPES:]) + types.get("", 0)
        if rest:
            parts.append(f"{rest} other")
        return f"{count} nodes{verb}: {', '.join(parts)}"
    noun = "entries" if isinstance(value, dict) else "items"
    return f"{name}: {count} {noun}"
