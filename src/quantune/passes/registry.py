"""Passes by name (``static_quant``, ...): ``@register_pass``, or an installed package's
``quantune.passes`` entry point (see :mod:`quantune.registry`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from quantune.registry import Registry

if TYPE_CHECKING:
    from quantune.passes.base import Knobs, Pass


def _is_pass(obj: object) -> bool:
    from quantune.passes.base import Pass

    return isinstance(obj, type) and issubclass(obj, Pass)


PASSES: Registry[type[Pass]] = Registry(
    "pass", "quantune.passes", field="passes", accepts=_is_pass, expected="a quantune Pass subclass"
)
P = TypeVar("P", bound="type[Pass]")


def register_pass(cls: P) -> P:
    """Class decorator: makes ``cls`` available under ``cls.name``."""
    PASSES.add(cls.name, cls)
    return cls


def pass_names() -> list[str]:
    return PASSES.names()


def find_pass(name: str | None) -> type[Pass] | None:
    """The pass named ``name`` (a plugin's loaded if need be), or None."""
    return PASSES.find(name) if name else None


def weights_rewritten(upstream: list[tuple[str, object]]) -> bool:
    """Whether a pass of ``upstream`` (name, config pairs) left the weights no longer float32."""
    return any((found := find_pass(name)) is not None and found.rewrites_weights for name, _ in upstream)


def facts_apply(facts: Mapping[str, Any], upstream: Sequence[tuple[str, Any]]) -> bool:
    """Whether the prepared graph's facts still describe a step's input (every upstream pass kept the graph)."""
    return bool(facts) and all(
        (found := find_pass(name)) is not None and found.keeps_graph(config) for name, config in upstream
    )


def knob_names(pick: Callable[[Knobs], str | None]) -> frozenset[str]:
    """The parameter names that play one role (``pick`` reads it from ``knobs``) in any registered pass."""
    return frozenset(name for cls in PASSES.registered().values() if (name := pick(cls.knobs)) is not None)


def qdq_quantized(upstream: Sequence[tuple[str, object]]) -> bool:
    """Whether the last static quantizer of ``upstream`` wrote the Q/DQ layout."""
    found = [(cls, config) for name, config in upstream if (cls := find_pass(name)) and cls.quantizes == "static"]
    if not found:
        return False
    cls, config = found[-1]
    layout = cls.knobs.layout
    return layout is None or getattr(config, layout, cls.knobs.qdq) == cls.knobs.qdq


def get_pass(name: str, *, field_name: str = "passes") -> type[Pass]:
    return PASSES.get(name, field_name=field_name)
