"""Moved to :mod:`quantune.graph.capability` (below the passes and the evaluation, which both
read it); this name is kept for code that imports it from here."""

from __future__ import annotations

from quantune.graph.capability import (
    FOLLOWER_TYPES,
    SHAPE_TYPES,
    Group,
    Mode,
    ModelCapability,
    NodeInfo,
    Precision,
    quantizable_op_types,
)

__all__ = [
    "FOLLOWER_TYPES",
    "SHAPE_TYPES",
    "Group",
    "Mode",
    "ModelCapability",
    "NodeInfo",
    "Precision",
    "quantizable_op_types",
]
