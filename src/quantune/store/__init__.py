"""Persistence: the content-addressed artifact cache and the per-run SQLite store."""

from __future__ import annotations

from quantune.store.cache import ArtifactCache, cache_key, default_cache_dir
from quantune.store.runstore import RunStore

__all__ = ["ArtifactCache", "RunStore", "cache_key", "default_cache_dir"]
