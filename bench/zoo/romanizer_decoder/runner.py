"""Greedy step-by-step decoding, as the romanizer runs its decoder: ``run(session, feeds)``.

Each feed holds the decoder's inputs for the first step of one name (prefix = BOS, the
encoder's memory, source mask and GRU state). Each call returns the log-probabilities of the
next token and the new GRU state; the best token is appended to the prefix and the state is
carried to the next call, until EOS or 32 tokens. The output per feed is ``tokens`` [1, 32],
padded with PAD (0): the same shape whatever a candidate decodes, so outputs stack and compare.
"""

from __future__ import annotations

import numpy as np

EOS, MAX_TOKENS = 2, 32


def steps(session, feed: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """The decoder's input at every step of the greedy decoding of one name."""
    inputs, seen = dict(feed), []
    for step in range(MAX_TOKENS):
        seen.append(dict(inputs))
        logprobs, hidden = session.run(None, inputs)
        if step == 0:
            logprobs[:, EOS] = -np.inf  # as the package's search: no empty outputs
        token = int(np.argmax(logprobs[0]))
        if token == EOS:
            break
        inputs["prefix"] = np.concatenate([inputs["prefix"], np.array([[token]], dtype=np.int64)], axis=1)
        inputs["hidden"] = hidden
    return seen


def run(session, feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    outputs = []
    for feed in feeds:
        last = steps(session, feed)[-1]
        logprobs, _ = session.run(None, last)
        tokens = last["prefix"][:, 1:]
        if int(np.argmax(logprobs[0])) != EOS and tokens.shape[1] < MAX_TOKENS:
            tokens = np.concatenate([tokens, np.argmax(logprobs, axis=-1)[:, None].astype(np.int64)], axis=1)
        padded = np.zeros((1, MAX_TOKENS), dtype=np.int64)  # PAD: every feed's output has one shape
        padded[:, : tokens.shape[1]] = tokens
        outputs.append({"tokens": padded})
    return outputs
