"""The provider axis in the speed-first strategy: every provider's ceilings before any accuracy work.

With ``target.providers`` the execution provider is a parameter of every flow
(``engine/providers.py``), and the fastest int8 model on one provider need not be the fastest on
another: on the PP-OCRv5 recognizer the fully quantized model ran at 0.61x the original's latency
on the CPU provider and 0.50x on OpenVINO, and a run whose ceilings were timed on the CPU provider
only recovered accuracy there. So the ceilings are per provider: each fully quantized variant on
each provider that can load it (what one cannot is pruned by ``space/providers.py``), timed in the
one side-by-side session of the ceiling stage together with the original on every other provider.

The original on another provider that met the criterion (its opening, ``strategy/openings.py``)
is a model in budget that cost no accuracy. A quantized ceiling that does not beat it by the
speed margin cannot win, whatever fallback recovers its accuracy, so it is dropped before any
accuracy evaluation: recovery runs only on providers where a win over the best model known in
budget is still possible, and where the original on a provider beats every int8 ceiling, nothing
is recovered and that original is the answer. Generic: it reads the plan's provider step and the
measured ratios, never a model or a provider name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from quantune.passes.registry import find_pass
from quantune.space import Point
from quantune.space.providers import short_provider
from quantune.strategy.base import Outcome, SearchProblem

FLOW_KEY = "flow"


def _provider_step(pass_name: str) -> bool:
    found = find_pass(pass_name)
    return found is not None and found.role == "provider"


def provider_axis(problem: SearchProblem) -> tuple[str, list[str], str] | None:
    """(the provider step, the providers it searches, the reference provider), or None when the
    run searches one provider only."""
    step = next((sid for sid, name in problem.step_passes.items() if _provider_step(name)), None)
    if step is None:
        return None
    param = problem.subspace([step], {}).params.get(f"{step}.provider")  # the step's own, not gated by flow
    choices = getattr(param, "choices", None)
    if not choices or len(choices) < 2:
        return None
    reference = str(problem.step_fixed.get(step, {}).get("reference", choices[0]))
    return step, [str(c) for c in choices], reference


def on_providers(problem: SearchProblem, variants: Sequence[tuple[Point, str]]) -> list[tuple[Point, str]]:
    """Each ``(point, label)`` on every searched provider that can run it (the variant first on
    each provider, in the axis's order: the reference provider's first); as given without an axis."""
    axis = provider_axis(problem)
    if axis is None:
        return list(variants)
    step, providers, _ = axis
    out = []
    for point, label in variants:
        for provider in providers:
            placed = {**point, f"{step}.provider": provider}
            if problem.space.is_valid(placed):
                out.append((placed, f"{label} on {short_provider(provider)}"))
    return out


def original_points(problem: SearchProblem) -> list[tuple[str, Point, tuple[str, ...]]]:
    """(provider, point, flow) of the original on each searched provider but the reference one."""
    axis = provider_axis(problem)
    if axis is None:
        return []
    step, providers, reference = axis
    flow = (step,)
    named = next((name for name, steps in problem.flows.items() if tuple(steps) == flow), None)
    out = []
    for provider in providers:
        if provider == reference:
            continue
        point: Point = {f"{step}.provider": provider}
        if named is not None and len(problem.flows) > 1:
            point[FLOW_KEY] = named
        if problem.space.is_valid(point):
            out.append((provider, point, flow))
    return out


class ProviderCeilings:
    """Mixin of the ceiling stage (``ceilings.py``): the originals on other providers, timed with
    the ceilings, and the rule that drops a ceiling an original in budget already beats."""

    problem: SearchProblem
    ctx: Any

    def observe_opening(self, provider: str, outcome: Outcome, paired_ratio: float | None = None) -> None:
        """Told by ``WithOpenings``: whether the original on ``provider`` met the criterion there, and
        its paired ratio (used until the ceilings' session times it with the ceilings)."""
        self._opening_meets()[provider] = bool(outcome.meets) and not outcome.failed
        if paired_ratio is not None:
            self._originals_ratios().setdefault(provider, paired_ratio)

    def _opening_meets(self) -> dict[str, bool]:
        if not hasattr(self, "_openings_met"):
            self._openings_met: dict[str, bool] = {}
        return self._openings_met

    def _originals_ratios(self) -> dict[str, float | None]:
        if not hasattr(self, "_original_ratio"):
            self._original_ratio: dict[str, float | None] = {}
        return self._original_ratio

    def original_items(self) -> list[tuple[Point, tuple[str, ...]]]:
        """The originals on the other providers, as items of the ceilings' side-by-side session."""
        self._originals = original_points(self.problem)
        return [(point, flow) for _, point, flow in self._originals]

    def note_originals(self, ratios: Sequence[float | None]) -> None:
        """Their side-by-side ratios (in the order of :meth:`original_items`)."""
        for (provider, _, _), ratio in zip(getattr(self, "_originals", []), ratios, strict=False):
            if ratio is not None:  # else what its opening timed stands
                self._originals_ratios()[provider] = ratio

    def best_original(self) -> tuple[str, float] | None:
        """The fastest original on another provider that met the criterion, side by side with
        the original on the reference provider: (provider, ratio); None when none is known."""
        met = self._opening_meets()
        ratios = self._originals_ratios().items()
        timed = [(ratio, p) for p, ratio in ratios if ratio is not None and ratio < 1.0 and met.get(p)]
        if not timed:
            return None
        ratio, provider = min(timed)
        return provider, ratio

    def beaten_by_original(self, ratio: float, margin: float) -> str | None:
        """Why a ceiling at ``ratio`` cannot win (an original in budget on another provider is not
        slower than it by the margin), or None."""
        best = self.best_original()
        if best is None or ratio < best[1] * (1.0 - margin) or not self._drops_slow():
            return None
        provider, theirs = best
        return (
            f"dropped: {ratio:.2f}x fp32 latency, not below {theirs * (1.0 - margin):.2f}x: the original on "
            f"{short_provider(provider)} is in budget at {theirs:.2f}x"
        )

    def _drops_slow(self) -> bool:
        """The ``drop_slow`` option (default true; false keeps every ceiling, ordered by speed)."""
        return bool(self.options.drop_slow)  # type: ignore[attr-defined]  # the strategy's typed options

    def learned(self) -> dict[str, Any]:
        """results.json's ``strategy``, with the originals' ratios from the ceilings' session."""
        notes = super().learned()  # type: ignore[misc]
        if ratios := self._originals_ratios():
            notes["provider_original_ratios"] = dict(ratios)
        return notes
