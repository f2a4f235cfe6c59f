"""A trial as data: what was asked (flow + point) and what came back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from quantune.space import Point

Status = Literal["ok", "failed"]


@dataclass(frozen=True)
class Trial:
    number: int
    flow: tuple[str, ...]
    params: Point
    # a miss is not timed: only the closest miss's speed matters, timed at the run's end
    untimed_if_missed: bool = False


@dataclass
class TrialRecord:
    """One finished trial; its dict form is an entry of ``results.json``'s ``trials``."""

    number: int
    flow: list[str]
    params: Point
    status: Status
    metrics: dict[str, float] = field(default_factory=dict)
    meets_criterion: bool | None = None
    accuracy_loss: float | None = None
    objective: float | None = None
    durations: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    model_path: str | None = None
    stage: str = ""
    log_tail: str | None = None
    asked_after: int = 0  # tells done when this trial was asked (for exact resume)
    told_index: int = 0  # place in the order of tells
    model_sha256: str | None = None  # content hash of the candidate model (same hash: same model)
    failure_class: str | None = None  # a failed trial's cause: where it failed + the kind of error (failures.py)
    peak_rss_mb: float | None = None  # the trial's peak resident memory, measured where it ran
    session_settings: dict[str, Any] | None = None  # onnxruntime session settings it runs with
    untimed: str | None = None  # why its latency and memory were not measured; None: measured
    # on a cluster: {"built": node that built and evaluated it, "timed": node that timed it}
    nodes: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialRecord:
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data})
