"""Passes by name (``static_quant``, ...), so configs can name them and users can add their own."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from quantune.errors import QuantuneError

if TYPE_CHECKING:
    from quantune.passes.base import Pass

_PASSES: dict[str, type[Pass]] = {}
P = TypeVar("P", bound="type[Pass]")


def register_pass(cls: P) -> P:
    """Class decorator: makes ``cls`` available under ``cls.name``."""
    _PASSES[cls.name] = cls
    return cls


def pass_names() -> list[str]:
    return sorted(_PASSES)


def get_pass(name: str, *, field_name: str = "passes") -> type[Pass]:
    try:
        return _PASSES[name]
    except KeyError:
        raise QuantuneError(f"{field_name}: unknown pass '{name}'; known passes are {pass_names()}") from None
