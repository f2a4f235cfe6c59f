"""arabic-name-romanizer's attention decoder (``decoder.onnx``, arabic-name-romanizer 0.2.0, MIT),
run step by step as deployed, on Arabic names from Faker's name lists.

The romanizer is a GRU encoder and a GRU + attention decoder (opset 17) over 160 character
tokens; the package decodes one token per decoder call, feeding back the growing prefix and
the GRU state (``hidden``). quantune tunes the decoder; the encoder stays fp32 (it runs once
per name, here at build time). The names: Faker 40.54.0's Arabic person names (MIT; given
names from ``ar_AA``, Saudi family names from ``ar_SA``), encoded as the package does
(country token, role token, the characters, EOS).

- eval_feeds.npz: one feed per name, the decoder's inputs for its first step (prefix = BOS,
  the encoder's memory, source mask and hidden state); ``runner.py:run`` decodes greedily
  from there with the session it is given.
- calib_feeds.npz: the decoder's inputs at every step of the fp32 model's greedy decoding of
  other names (the data a step-by-step decoder sees as deployed).
"""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

import numpy as np
from zoolib import extract, member, save_feeds

PACKAGE, NAMES = "arabic-name-romanizer==0.2.0", "faker==40.54.0"
FILES = ["model.onnx", "calib_feeds.npz", "eval_feeds.npz", "vocab.json"]


def faker_names(locale: str, field: str) -> list[str]:
    tree = ast.parse(member(NAMES, f"faker/providers/person/{locale}/__init__.py").decode("utf-8"))
    for node in ast.walk(tree):
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        if any(getattr(t, "id", None) == field for t in targets) and node.value is not None:
            return list(ast.literal_eval(node.value))
    raise RuntimeError(f"faker {locale}: no {field}")


def build(target: Path) -> list[str]:
    import onnxruntime as ort

    extract(PACKAGE, "arabic_name_romanizer/resources/decoder.onnx", target / "model.onnx")
    encoder_path = extract(PACKAGE, "arabic_name_romanizer/resources/encoder.onnx", target / "encoder.onnx")
    vocab_json = member(PACKAGE, "arabic_name_romanizer/resources/vocab.json")
    (target / "vocab.json").write_bytes(vocab_json)
    index = {token: i for i, token in enumerate(json.loads(vocab_json)["tokens"])}
    given = faker_names("ar_AA", "first_names_male") + faker_names("ar_AA", "first_names_female")
    family = faker_names("ar_SA", "last_names")
    rng = random.Random(0)
    rng.shuffle(given)
    names = [(n, "<UNK_COUNTRY>", "<ROLE_GIVEN>") for n in given[:84]] + [(n, "<SA>", "<ROLE_SURNAME>") for n in family]
    rng.shuffle(names)
    encoder = ort.InferenceSession(str(encoder_path), providers=["CPUExecutionProvider"])
    decoder = ort.InferenceSession(str(target / "model.onnx"), providers=["CPUExecutionProvider"])
    first_steps = []
    for text, country, role in names:
        ids = [index[country], index[role], *(index.get(c, 3) for c in text), 2]
        src = np.array([ids], dtype=np.int64)
        memory, mask, hidden = encoder.run(None, {"src": src, "src_mask": src == 0})
        first_steps.append(
            {"prefix": np.array([[1]], dtype=np.int64), "memory": memory, "src_mask": mask, "hidden": hidden}
        )
    save_feeds(target / "eval_feeds.npz", first_steps[:96])
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from runner import steps

    calibration = [feed for start in first_steps[96:] for feed in steps(decoder, start)]
    save_feeds(target / "calib_feeds.npz", calibration)
    return FILES
