"""The accuracy criterion: how much a candidate may lose against the original model.

``relative`` compares the loss with the baseline's magnitude (0.01 = at most 1% of the
original's figure); ``absolute`` with the metric's own units.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

_EPS = 1e-12


@dataclass(frozen=True)
class CriterionCheck:
    """``loss`` in the criterion's units; ``violation``: how much of it is over the budget (0: met)."""

    meets: bool
    loss: float
    violation: float


@dataclass(frozen=True)
class Criterion:
    kind: Literal["relative", "absolute"]
    tolerable_loss: float
    higher_is_better: bool = True

    def check(self, baseline: float, candidate: float) -> CriterionCheck:
        drop = baseline - candidate if self.higher_is_better else candidate - baseline
        loss = drop / max(abs(baseline), _EPS) if self.kind == "relative" else drop
        return CriterionCheck(meets=self.meets(loss), loss=loss, violation=self.violation(loss))

    def meets(self, loss: float) -> bool:
        # A tiny tolerance so that a loss equal to the budget (up to float rounding) meets it.
        return loss <= self.tolerable_loss + 1e-12

    def violation(self, loss: float) -> float:
        """How far ``loss`` is over the budget: 0 when it meets it, else > 0 (what samplers minimise)."""
        return 0.0 if self.meets(loss) else loss - self.tolerable_loss

    def worst_accepted(self, baseline: float) -> float:
        """The metric value the criterion accepts at worst against the original's ``baseline``."""
        allowed = self.tolerable_loss * abs(baseline) if self.kind == "relative" else self.tolerable_loss
        return baseline - allowed if self.higher_is_better else baseline + allowed

    def to_json(self) -> dict[str, Any]:
        """results.json's ``criterion``: the config's keys, and the description the report shows."""
        return {
            "type": self.kind,
            "tolerable_loss": self.tolerable_loss,
            "higher_is_better": self.higher_is_better,
            "description": self.describe(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Criterion:
        """The criterion a results.json recorded (:meth:`to_json`)."""
        return cls(
            kind=data["type"],
            tolerable_loss=float(data["tolerable_loss"]),
            higher_is_better=bool(data.get("higher_is_better", True)),
        )

    def describe(self) -> str:
        budget = f"{self.tolerable_loss:.2%}" if self.kind == "relative" else f"{self.tolerable_loss:g}"
        direction = "higher is better" if self.higher_is_better else "lower is better"
        return f"at most {budget} {self.kind} loss ({direction})"


RELATIVE_WARN = 0.5  # a relative budget above this allows losing more than half the metric


def check_budget(criterion: Criterion, metric: str, baseline: dict[str, float]) -> None:
    """A relative budget against a baseline of 0 is an error; one above 50% or finer than a row, a warning."""
    from quantune.errors import ConfigError
    from quantune.evaluate.rows import resolution_warning

    if message := resolution_warning(criterion.kind, criterion.tolerable_loss, metric, baseline):
        _warn(message)
    if criterion.tolerable_loss == float("inf"):
        _warn(
            f"criterion.tolerable_loss: inf accepts any loss of {metric}, so accuracy is not guarded; "
            "give a finite budget (e.g. 0.01) to guard it"
        )
        return
    if criterion.kind != "relative":
        return
    value = baseline.get(metric)
    if value is not None and abs(value) <= _EPS:
        raise ConfigError(
            f"criterion.type: relative losses are fractions of the original model's {metric} ({value:g}), "
            "so no candidate can ever meet the criterion; use `type: absolute` with tolerable_loss in the "
            f"metric's own units (e.g. tolerable_loss: 0.01 for {metric})"
        )
    if criterion.tolerable_loss > RELATIVE_WARN:
        _warn(
            f"criterion.tolerable_loss: {criterion.tolerable_loss:g} with type relative allows losing "
            f"{criterion.tolerable_loss:.0%} of the original's {metric}; did you mean {criterion.tolerable_loss / 100:g}?"
        )


def _warn(message: str) -> None:
    import logging
    import sys

    logger = logging.getLogger("quantune")
    logger.warning(message)
    if logger.hasHandlers():  # else logging's last resort says it (the CLI's: once, as one line)
        print(f"quantune: warning: {message}", file=sys.stderr)
