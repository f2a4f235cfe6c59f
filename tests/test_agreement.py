"""The one-pass agreement figures equal the metrics' own, bit for bit (evaluate/agreement.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantune.evaluate import agreement
from quantune.evaluate.agreement import agreement_figures
from quantune.evaluate.feeds import over_feeds
from quantune.evaluate.metrics import AGREEMENT_METRICS


def metric_by_metric(outputs: list[np.ndarray], references: list[np.ndarray]) -> dict[str, float]:
    return {name: over_feeds(name, func, outputs, references) for name, func in AGREEMENT_METRICS.items()}


def same(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] or (np.isnan(a[k]) and np.isnan(b[k])) for k in a)


@st.composite
def feed_pairs(draw: st.DrawFn) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    count = draw(st.integers(1, 7))
    widths_vary = draw(st.booleans())
    classes = draw(st.integers(1, 6))
    outputs, references = [], []
    for _ in range(count):
        rows = draw(st.integers(1, 3))
        width = draw(st.integers(1, 4)) if widths_vary else 3
        reference = rng.standard_normal((rows, width, classes)).astype(np.float32)
        output = reference + rng.standard_normal(reference.shape).astype(np.float32) * draw(
            st.sampled_from([0, 0.1, 2])
        )
        kind = draw(st.sampled_from(["plain", "constant", "zero", "nan", "tie", "inf"]))
        if kind == "constant":
            output[0] = 1.5
        elif kind == "zero":
            output[...] = 0.0
        elif kind == "nan":
            output[0, 0, 0] = np.nan
        elif kind == "tie":
            reference[0] = 0.25
        elif kind == "inf":
            output[-1, -1, -1] = np.inf
        outputs.append(output)
        references.append(reference)
    return outputs, references


@settings(max_examples=150, deadline=None)
@given(pairs=feed_pairs(), block=st.sampled_from([1, 5, 40, 1 << 21]))
def test_one_pass_equals_the_metrics(pairs: tuple[list[np.ndarray], list[np.ndarray]], block: int) -> None:
    """Any blocking (a block smaller than a row, a block across feeds), stacking or not, broken rows included."""
    outputs, references = pairs
    original = agreement.BLOCK_ELEMENTS
    import quantune.evaluate.metrics as metrics

    try:
        agreement.BLOCK_ELEMENTS = metrics.BLOCK_ELEMENTS = block
        assert same(agreement_figures(outputs, references), metric_by_metric(outputs, references))
    finally:
        agreement.BLOCK_ELEMENTS = metrics.BLOCK_ELEMENTS = original


def test_wide_outputs_equal_the_metrics() -> None:
    """A recognizer's shape: many feeds of one row, each wider than a block's share."""
    rng = np.random.default_rng(3)
    references = [rng.standard_normal((1, 22, 4000)).astype(np.float32) for _ in range(40)]
    outputs = [r + rng.standard_normal(r.shape).astype(np.float32) * 0.05 for r in references]
    figures = agreement_figures(outputs, references)
    assert same(figures, metric_by_metric(outputs, references))
    assert 0.9 < figures["cosine"] < 1.0 and figures["l2"] > 0


@pytest.mark.parametrize(
    "outputs, references",
    [
        ([np.float32(1.0)], [np.float32(1.0)]),  # scalars
        ([np.zeros((2, 3), np.float32)], [np.zeros((2, 4), np.float32)]),  # shapes that differ
        ([np.arange(6).reshape(2, 3)], [np.arange(6).reshape(2, 3)]),  # integers
    ],
)
def test_what_the_one_pass_leaves_to_the_metrics(outputs: list, references: list) -> None:
    try:
        expected = metric_by_metric(outputs, references)
    except Exception as exc:  # the metrics' own error, raised the same way
        with pytest.raises(type(exc)):
            agreement_figures(outputs, references)
        return
    assert same(agreement_figures(outputs, references), expected)
