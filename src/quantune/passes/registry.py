"""Passes by name (``static_quant``, ...), so configs can name them and users can add their own.

A pass registers under its class's ``name`` with ``@register_pass``, or comes from an installed
package's ``quantune.passes`` entry point (see :mod:`quantune.registry`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from quantune.registry import Registry

if TYPE_CHECKING:
    from quantune.passes.base import Pass


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
    """The pass named ``name`` (a plugin's loaded if need be), or None: for reading a pass's
    traits by its name (a step's pass, an upstream step) where an unknown name means "none"."""
    return PASSES.find(name) if name else None


def weights_rewritten(upstream: list[tuple[str, object]]) -> bool:
    """Whether a pass of ``upstream`` (name, config pairs) left the weights no longer float32."""
    return any((found := find_pass(name)) is not None and found.rewrites_weights for name, _ in upstream)


def get_pass(name: str, *, field_name: str = "passes") -> type[Pass]:
    return PASSES.get(name, field_name=field_name)
