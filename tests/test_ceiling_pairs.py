"""Every two speed ceilings timed side by side answer a paired timing of the two from the same rounds.

The strategy asks, after the ceilings, whether the fastest kept variant is faster beyond the noise
than the one it prefers (in budget already); those two were just timed in the same interleaved rounds.
A detector's QDQ and QOperator uint8 ceilings were timed again in a session of their own for it (3.3 s).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from quantune.engine.measure.paired_timing import paired_latency, store_pairs
from quantune.evaluate.latency import LatencySpec


class _Cache:
    def __init__(self) -> None:
        self.entries: dict[str, Any] = {}

    def get_json(self, kind: str, key: str) -> Any:
        return self.entries.get(f"{kind}/{key}")

    def put_json(self, kind: str, key: str, value: Any) -> None:
        self.entries[f"{kind}/{key}"] = value


class _Untimed:
    def fingerprint(self) -> str:
        return "cpu"

    def time(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the pair was timed again")


def _context() -> Any:
    evaluator = SimpleNamespace(
        spec=SimpleNamespace(latency=LatencySpec(), runner=None),
        dataset=SimpleNamespace(fingerprint="data"),
        backend=_Untimed(),
    )
    return SimpleNamespace(cache=_Cache(), evaluator=evaluator)


def _rounds(rng: np.random.Generator, seconds: float, rounds: int, total: int, noise: float = 0.005) -> np.ndarray:
    row = np.full(total, np.nan)
    row[:rounds] = seconds * (1.0 + rng.normal(0.0, noise, rounds))
    return row


def test_two_ceilings_timed_together_answer_their_paired_timing_without_a_session() -> None:
    rng = np.random.default_rng(0)
    timings = np.stack(
        [
            _rounds(rng, 0.078, 8, 8),  # the original
            _rounds(rng, 0.075, 8, 8),  # QDQ uint8
            _rounds(rng, 0.0752, 8, 8),  # QOperator uint8: one speed with it
            _rounds(rng, 0.115, 2, 8),  # QDQ int8: far slower, sat out after two rounds
        ]
    )
    sha_of = {1: "qdq", 2: "qop", 3: "int8"}
    context = _context()
    pairs = [(row, other) for row in sha_of for other in sha_of if row != other]
    assert store_pairs(context, timings, pairs, sha_of, most=20, quiet=True) == 2  # too few rounds with row 3
    models = {"qdq": ("qdq.onnx", "qdq"), "qop": ("qop.onnx", "qop"), "int8": ("int8.onnx", "int8")}

    def build(point: dict, flow: tuple) -> tuple[str, str]:
        return models[point["name"]]

    answer = paired_latency(context, ({"name": "qop"}, ()), ({"name": "qdq"}, ()), build)
    assert answer is not None and answer["faster"] is False and answer["rounds"] == 8
    assert 0.99 < answer["ratio_median"] < 1.02


def test_a_pair_the_rounds_left_undecided_is_timed_on_its_own_unless_they_ran_to_the_end() -> None:
    rng = np.random.default_rng(1)
    noisy = np.stack([_rounds(rng, 0.078, 6, 6, 0.1), _rounds(rng, 0.076, 6, 6, 0.1), _rounds(rng, 0.077, 6, 6, 0.1)])
    sha_of = {1: "a", 2: "b"}
    pairs = [(1, 2), (2, 1)]
    assert store_pairs(_context(), noisy, pairs, sha_of, most=20, quiet=True) == 0  # undecided after 6 of 20
    assert store_pairs(_context(), noisy, pairs, sha_of, most=6, quiet=True) == 2  # 6 were all the session had
