"""Typed ``search.strategy_options``: one pydantic model per strategy (``Strategy.Options``), so a
mistyped option is one line naming the key and the allowed ones, and each default is written
here, once. A plugin strategy without an ``Options`` class gets its options unchecked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quantune.errors import ConfigError


class StrategyOptions(BaseModel):
    """No options (joint, pass-by-pass, chain)."""

    model_config = ConfigDict(extra="forbid")


class AccuracyOptions(StrategyOptions):
    """Options every accuracy-driven strategy takes: op constraints (Neural Compressor's op_type_dict)."""

    fp32_op_types: list[str] = Field(default_factory=list, description="Op types always kept in fp32.")
    fp32_nodes: list[str] = Field(default_factory=list, description="Node names always kept in fp32.")
    int8_op_types: list[str] = Field(default_factory=list, description="Op types never fallen back.")
    int8_nodes: list[str] = Field(default_factory=list, description="Node names never fallen back.")
    # no fp16: onnxruntime's CPU provider lacks fp16 kernels for most ops
    precisions: list[Literal["int16", "fp32"]] = Field(
        default_factory=lambda: ["fp32"], description="Fallback precisions, preferred first (int16: QDQ only)."
    )
    flow: str | None = Field(default=None, description="Tune only this flow (default: every flow that quantizes).")
    sensitivity_rows: int = Field(
        default=128,
        gt=0,
        description="Calibration rows of the sensitivity run at most; fewer where the run would take longer than "
        "about two evaluations of the original.",
    )


class FallbackOptions(AccuracyOptions):
    """basic, conservative, auto, mse, mse_v2."""

    tuning_trials: int = Field(default=4, ge=0, description="Parameter-tuning trials before any fallback.")


class TwoStageOptions(AccuracyOptions):
    """two_stage."""

    calibration_trials: int | None = Field(
        default=None, gt=0, description="Trials of the calibration stage (default: half of stop.max_trials)."
    )


class QuantuneOptions(AccuracyOptions):
    """quantune: speed ceilings, op-type-wise and per-group fallback, latency."""

    speed_margin: float = Field(
        default=0.03, ge=-1, lt=1, description="A variant must beat the original's latency by this share."
    )
    drop_slow: bool = Field(default=True, description="Drop variants whose ceiling is not faster than the original.")
    skip_slower_twins: bool = Field(
        default=True,
        description="Skip a speed ceiling whose quantization runs on kernels the runtime knows slow where "
        "another variant is the same quantization on fast ones (S8S8 QOperator on x86, int8 ConvInteger).",
    )
    screen_trials: int = Field(default=2, ge=0, description="One-at-a-time accuracy parameter changes.")
    op_type_trials: int = Field(
        default=6, ge=0, description="Evaluations bisecting which groups of op types put in fp32 go back to int8."
    )
    bisect_blocks: bool = Field(default=True, description="Bisect over repeated blocks before single groups.")
    prune_trials: int = Field(default=8, ge=0, description="Fallen groups tried back in int8 (or int16).")
    targeted_units: int = Field(
        default=3, ge=0, description="The worst units given per-channel weights / a fine-tune before any fallback."
    )
    recover_within: float | None = Field(
        default=4.0,
        ge=0,
        description="Refining passes (bias correction, fast fine-tune; the flows that add them) are tried "
        "only on a variant whose loss is over the budget by at most this many budgets (None: always): "
        "they mend rounding, not a model int8 broke (F1 0 on a detector's decode head).",
    )
    latency_trials: int | None = Field(
        default=None,
        ge=0,
        description="Most trials of the latency stage at the end (default: what max_trials leaves).",
    )
    latency_patience: int = Field(
        default=3,
        ge=1,
        description="The latency stage ends after this many candidates in a row that are not faster than "
        "the incumbent beyond the noise, timed side by side.",
    )
    stop_at_ceiling: bool = Field(
        default=True,
        description="End the search once a model in budget is at the speed ceiling of the fastest variant "
        "still in play (nothing faster is possible).",
    )
    ceiling_share: float = Field(
        default=0.25, gt=0, le=1, description="The most of stop.timeout_s the speed ceilings may take."
    )
    stand_ins: bool = Field(
        default=True,
        description="When the first guess needs no calibration, time each static ceiling on a model "
        "calibrated on two rows (the same graph: calibration moves scales only); the full calibration "
        "is done when a static variant is tried.",
    )
    first_guess: bool | None = Field(
        default=None,
        description="Evaluate the likeliest ceiling (Neural Compressor's defaults in the flow it would pick) "
        "before the ceilings are timed, for an early first model in budget. Default: when the engine "
        "evaluates it beside the original (process executor), where it costs no wait.",
    )


def validate_options(
    strategy: str, options_cls: type[StrategyOptions] | None, raw: Mapping[str, Any]
) -> StrategyOptions | dict[str, Any]:
    """The options the user set as the strategy's model, defaults filled (as given when it has none)."""
    if options_cls is None:
        return dict(raw)
    try:
        return options_cls.model_validate(dict(raw))
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(part) for part in error["loc"])
        allowed = ", ".join(options_cls.model_fields) or "none"
        if error["type"] == "extra_forbidden":
            message = f"strategy '{strategy}' has no option '{key}' (allowed: {allowed})"
        else:
            message = f"{error['msg']} (strategy '{strategy}')"
        raise ConfigError(f"search.strategy_options.{key}: {message}") from None


OptionsT = TypeVar("OptionsT", bound=StrategyOptions)


def options_as(
    options: StrategyOptions | Mapping[str, Any], options_cls: type[OptionsT], strategy: str = ""
) -> OptionsT:
    """``options`` as ``options_cls``, validated here unless it already is one. With no ``strategy``
    name only ``options_cls``'s own keys are read (a context shared by strategies with more options)."""
    if isinstance(options, options_cls):
        return options
    raw = options.model_dump(exclude_unset=True) if isinstance(options, BaseModel) else dict(options)
    if not strategy:
        raw = {key: value for key, value in raw.items() if key in options_cls.model_fields}
    checked = validate_options(strategy or options_cls.__name__, options_cls, raw)
    assert isinstance(checked, options_cls)
    return checked
