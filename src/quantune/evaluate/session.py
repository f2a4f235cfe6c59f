"""One place where evaluation sessions are opened, so every measurement runs a model the same way:
where (provider and options) and how (session settings a flow chose) are arguments, so they apply
to the original and every candidate alike."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnxruntime as ort

from quantune.evaluate.target_server import build_session_options, chosen_provider

DEFAULT_PROVIDER = "CPUExecutionProvider"


def session_options(
    *, threads: int, timing: bool = False, settings: Mapping[str, Any] | None = None
) -> ort.SessionOptions:
    """onnxruntime options: ``threads``, ``settings`` on top, and with ``timing`` what makes timings comparable."""
    return build_session_options(ort, threads, timing, settings)


def open_session(
    model: str | Path | bytes,
    *,
    threads: int,
    timing: bool = False,
    settings: Mapping[str, Any] | None = None,
    provider: str = DEFAULT_PROVIDER,
    provider_options: Mapping[str, Any] | None = None,
) -> ort.InferenceSession:
    """A session for ``model`` (path or bytes) on ``provider``, or on the provider its ``settings`` name."""
    provider, provider_options = chosen_provider(provider, provider_options, settings)
    options = session_options(threads=threads, timing=timing, settings=settings)
    source = model if isinstance(model, bytes) else str(model)
    providers: list[Any] = [provider if not provider_options else (provider, dict(provider_options))]
    if provider != DEFAULT_PROVIDER:
        providers.append(DEFAULT_PROVIDER)  # ops the provider does not take fall back to the CPU
    return ort.InferenceSession(source, options, providers=providers)
