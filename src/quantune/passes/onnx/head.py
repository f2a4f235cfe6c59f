"""Moved to :mod:`quantune.graph.head` (the evaluation reads it too); this name is kept for code
that imports it from here."""

from __future__ import annotations

from quantune.graph.head import COMPUTE, head_groups, head_nodes

__all__ = ["COMPUTE", "head_groups", "head_nodes"]
